package worker_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/tracing"
	"github.com/quillhq/quill/internal/worker"
)

// TestHandlingIsThePublishsChild: one create is one trace through the API,
// the relay and the worker — the API's request span (the client's span
// its parent), the relay's publish of
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

	// The create through the API's handler, from a client whose trace
	// context it continues, tracestate included.
	api := httptest.NewServer(httpapi.NewServer(httpapi.Deps{Pool: h.pool, Notes: h.svc, Log: testkit.Logger(t), Tracer: tracer}))
	defer api.Close()
	token, err := auth.Create(t.Context(), h.pool, h.tenant, time.Now())
	require.NoError(t, err)
	body, err := json.Marshal(map[string]any{"title": "traced", "attachment": map[string]string{
		"filename": "a.png", "content_type": "image/png", "data": base64.StdEncoding.EncodeToString(attachment.BenchFixturePNG64K())}})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, api.URL+"/v1/notes", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", "trace-"+uuid.NewString())
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-0102030000000000000000000000000a-0405060000000000-01")
	req.Header.Set("tracestate", "rojo=00f067aa0ba902b7")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusCreated, res.StatusCode)
	testkit.WaitFor(t, waitLong, func() bool {
		return h.count(`SELECT count(*) FROM outbox_events WHERE type = $1 AND published_at IS NOT NULL`, contract.EventAttachmentProcessed) == 1
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
		_, ok := find("send " + contract.EventAttachmentProcessed)
		return ok
	}, "the second publish's span ended")
	request, _ := find("POST /v1/notes")
	publish, ok := find("send " + contract.EventNoteCreated)
	require.True(t, ok)
	handling, ok := find("process quill.note.created.v1")
	require.True(t, ok, "spans: %v", names(spans))
	republish, _ := find("send " + contract.EventAttachmentProcessed)

	for _, s := range []tracetest.SpanStub{request, publish, handling, republish} {
		require.Equal(t, request.SpanContext.TraceID(), s.SpanContext.TraceID(), "%s is in the trace", s.Name)
		require.Equal(t, "rojo=00f067aa0ba902b7", s.SpanContext.TraceState().String(), "%s keeps the tracestate", s.Name)
	}
	require.Equal(t, "0102030000000000000000000000000a", request.SpanContext.TraceID().String(), "the client's trace")
	require.Equal(t, request.SpanContext.SpanID(), publish.Parent.SpanID())
	require.Equal(t, publish.SpanContext.SpanID(), handling.Parent.SpanID(), "the handling is the publish's child")
	require.Equal(t, trace.SpanKindConsumer, handling.SpanKind)
	require.Equal(t, handling.SpanContext.SpanID(), republish.Parent.SpanID(), "the event the handling wrote carries its span")
	var stored string
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT traceparent FROM outbox_events WHERE type = $1`, contract.EventAttachmentProcessed).Scan(&stored))
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
