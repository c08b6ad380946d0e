package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/tracing"
	"github.com/quillhq/quill/internal/worker"
)

// TestHandlingIsThePublishsChild: one create's trace goes on through the
// worker — the write's span (as the API makes it), the relay's publish of
// note.created as its child, the worker's handling as the publish's child,
// and the attachment.processed event that handling wrote published as the
// handling's child; one trace, the tracestate kept throughout.
func TestHandlingIsThePublishsChild(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.stopRelay() // a traced relay instead
	exp := tracetest.NewInMemoryExporter()
	tracer := tracing.NewWithExporter(exp, "quill").Tracer()
	pool, err := db.Open(context.Background(), h.url, 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	nc, _ := h.srv.Connect(t, relay.ConnOptions()...)
	r, err := relay.New(pool, nc, h.relayConfig(), testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()), relay.WithTracer(tracer))
	require.NoError(t, r.Provision(t.Context()))
	require.NoError(t, err)
	runUntilCleanup(t, r.Run)
	h.startWorker(h.config(), "", worker.WithTracer(tracer))

	// The write, under a span as the API's request makes it, with a
	// tracestate from the client.
	ctx, write := tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
		TraceState: mustTraceState(t, "rojo=00f067aa0ba902b7"), Remote: true})), "POST /v1/notes")
	tp, ts := tracing.Inject(ctx)
	data := attachment.BenchFixturePNG64K()
	sum := sha256.Sum256(data)
	out, err := h.svc.Create(ctx, notes.Request{Tenant: h.tenant, Key: "k-" + uuid.NewString(), Wait: -1, Render: httpapi.RenderWrite,
		Traceparent: tp, Tracestate: ts},
		notes.CreateParams{Title: "traced", Attachment: &notes.NewAttachment{Filename: "a.png", ContentType: "image/png", Data: data, SHA256: hex.EncodeToString(sum[:])}})
	require.NoError(t, err)
	write.End()
	require.Contains(t, string(out.Body), `"id"`)
	testkit.WaitFor(t, waitLong, func() bool {
		return h.count(`SELECT count(*) FROM outbox_events WHERE type = $1 AND published_at IS NOT NULL`, outbox.TypeAttachmentProcessed) == 1
	}, "attachment.processed published")

	var spans tracetest.SpanStubs
	find := func(name string) (tracetest.SpanStub, bool) {
		for _, s := range spans {
			if s.Name == name {
				return s, true
			}
		}
		return tracetest.SpanStub{}, false
	}
	testkit.WaitFor(t, waitLong, func() bool {
		spans = exp.GetSpans()
		_, ok := find("send " + outbox.TypeAttachmentProcessed)
		return ok
	}, "the second publish's span ended")
	request, _ := find("POST /v1/notes")
	publish, ok := find("send " + outbox.TypeNoteCreated)
	require.True(t, ok)
	handling, ok := find("process quill.note.created.v1")
	require.True(t, ok, "spans: %v", names(spans))
	republish, _ := find("send " + outbox.TypeAttachmentProcessed)

	for _, s := range []tracetest.SpanStub{request, publish, handling, republish} {
		require.Equal(t, request.SpanContext.TraceID(), s.SpanContext.TraceID(), "%s is in the trace", s.Name)
		require.Equal(t, "rojo=00f067aa0ba902b7", s.SpanContext.TraceState().String(), "%s keeps the tracestate", s.Name)
	}
	require.Equal(t, request.SpanContext.SpanID(), publish.Parent.SpanID())
	require.Equal(t, publish.SpanContext.SpanID(), handling.Parent.SpanID(), "the handling is the publish's child")
	require.Equal(t, trace.SpanKindConsumer, handling.SpanKind)
	require.Equal(t, handling.SpanContext.SpanID(), republish.Parent.SpanID(), "the event the handling wrote carries its span")
	var stored string
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT traceparent FROM outbox_events WHERE type = $1`, outbox.TypeAttachmentProcessed).Scan(&stored))
	require.Equal(t, "00-"+handling.SpanContext.TraceID().String()+"-"+handling.SpanContext.SpanID().String()+"-01", stored)
	require.False(t, handling.StartTime.After(handling.EndTime))
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func mustTraceState(t *testing.T, s string) trace.TraceState {
	ts, err := trace.ParseTraceState(s)
	require.NoError(t, err)
	return ts
}
