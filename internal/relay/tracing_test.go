package relay_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/tracing"
)

const (
	clientTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID      = "00f067aa0ba902b7"
	clientTraceparent = "00-" + clientTraceID + "-" + clientSpanID + "-01"
	clientTracestate  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

func spanNamed(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q among %d", name, len(spans))
	return tracetest.SpanStub{}
}

// One create, followed through the API (real PostgreSQL), the relay (real
// JetStream) and a consumer's handling, is one trace: the request's server
// span, a child of the client's, with the transaction as its child; the
// publish as the request span's child, through the traceparent the outbox
// row stored; the NATS message naming the publish span; the consumer's
// span its child. The client's tracestate reaches the NATS header.
func TestOneCreateIsOneTraceThroughAPIRelayAndConsumer(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	exp := tracetest.NewInMemoryExporter()
	tracer := tracing.NewWithExporter(exp, "quill").Tracer()
	ctx := h.ctx()

	svc, _ := h.notifyingNotes(ctx)
	api := httptest.NewServer(httpapi.NewServer(httpapi.Deps{Pool: h.pool, Notes: svc, Log: testkit.Logger(t), Tracer: tracer}))
	defer api.Close()
	token, err := auth.Create(ctx, h.pool, h.tenant, time.Now())
	require.NoError(t, err)
	r, _ := h.newRelay(h.config(), h.relayID("traced"), relay.WithTracer(tracer))
	require.NoError(t, r.Provision(ctx), "so that the first publish finds the stream")
	start(t, r)

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/notes", strings.NewReader(`{"title":"traced"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", "trace-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", clientTraceparent)
	req.Header.Set("tracestate", clientTracestate)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusCreated, res.StatusCode)

	h.waitPublished(1)
	msgs := h.requireExactlyOnce(1)
	msg := msgs[0]

	// The consumer's side, as the attachment worker's handling does it.
	_, handling := tracing.StartConsumerSpan(ctx, tracer, tracing.Header(msg.Header), "process note.created")
	handling.End()

	spans := exp.GetSpans()
	request := spanNamed(t, spans, "POST /v1/notes")
	transaction := spanNamed(t, spans, "transaction")
	publish := spanNamed(t, spans, "send "+contract.EventNoteCreated)
	consume := spanNamed(t, spans, "process note.created")
	for _, s := range []tracetest.SpanStub{request, transaction, publish, consume} {
		require.Equal(t, clientTraceID, s.SpanContext.TraceID().String(), "%s is in the client's trace", s.Name)
		require.Equal(t, clientTracestate, s.SpanContext.TraceState().String(), "%s keeps the tracestate", s.Name)
	}
	require.Equal(t, clientSpanID, request.Parent.SpanID().String(), "the request is the client's span's child")
	require.Equal(t, request.SpanContext.SpanID(), transaction.Parent.SpanID(), "the transaction is the request's child")
	require.Equal(t, request.SpanContext.SpanID(), publish.Parent.SpanID(), "the publish is the request's child")
	require.True(t, publish.Parent.IsRemote(), "through the outbox row")
	require.Equal(t, trace.SpanKindProducer, publish.SpanKind)
	require.Equal(t, codes.Unset, publish.Status.Code)
	require.Len(t, spans, 4, "one publish: no retry")
	require.Equal(t, publish.SpanContext.SpanID(), consume.Parent.SpanID(), "the handling is the publish's child")

	require.Equal(t, "00-"+clientTraceID+"-"+publish.SpanContext.SpanID().String()+"-01", msg.Header.Get("traceparent"),
		"the message names the publish span")
	require.Equal(t, clientTracestate, msg.Header.Get("tracestate"), "the client's tracestate reaches the NATS header")
}

// With tracing off the relay makes no span and publishes the stored trace
// context as it is, tracestate included.
func TestUntracedRelayPublishesTheStoredTraceContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r, _ := h.newRelay(h.config(), h.relayID("untraced"))
	start(t, r)
	e := h.event(h.tenant, uuid.New(), contract.EventNoteCreated, nil)
	e.Traceparent, e.Tracestate = clientTraceparent, clientTracestate
	h.writeEvent(e)
	h.waitPublished(1)
	msg := h.requireExactlyOnce(1)[0]
	require.Equal(t, []string{clientTraceparent}, msg.Header["traceparent"])
	require.Equal(t, []string{clientTracestate}, msg.Header["tracestate"])
}

// An event parked because it can never be published is logged with its
// publish span's trace_id and span_id; the span is failed.
func TestParkedEventLineNamesItsTrace(t *testing.T) {
	t.Parallel()
	h := newHarness(t, natstest.WithMaxPayload(4096))
	exp := tracetest.NewInMemoryExporter()
	logs := &clitest.SyncBuffer{}
	log, err := logging.New(logs, "info", "relay")
	require.NoError(t, err)
	r, _ := h.newRelayLogging(h.config(), h.relayID("park"), log, relay.WithTracer(tracing.NewWithExporter(exp, "quill").Tracer()))
	require.NoError(t, r.Provision(h.ctx()))
	start(t, r)
	e := h.event(h.tenant, uuid.New(), contract.EventNoteCreated, nil)
	e.Data = notes.NoteView{ID: e.AggregateID.String(), Title: "big", Body: strings.Repeat("x", 8192), CreatedAt: notes.FormatTime(time.Now()), Version: 1, UpdatedAt: notes.FormatTime(time.Now())}
	e.Traceparent = clientTraceparent
	h.writeEvent(e)
	testkit.WaitFor(t, waitLong, func() bool { return len(logs.Lines(t, "event parked: it cannot be published as it is")) == 1 }, "the event parked")

	line := logs.Lines(t, "event parked: it cannot be published as it is")[0]
	publish := spanNamed(t, exp.GetSpans(), "send "+contract.EventNoteCreated)
	require.Equal(t, clientTraceID, line["trace_id"])
	require.Equal(t, publish.SpanContext.SpanID().String(), line["span_id"])
	require.Equal(t, clientSpanID, publish.Parent.SpanID().String())
	require.Equal(t, codes.Error, publish.Status.Code)
}
