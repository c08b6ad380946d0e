package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/tracing"
)

const (
	clientTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	clientTracestate  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
)

type traceBundle struct {
	t      *testing.T
	srv    *httptest.Server
	token  string
	logs   *clitest.SyncBuffer
	stored func(key string) (traceparent, tracestate string)
}

// traceSetup is an API over a fresh schema whose spans go to exp; exp nil
// is tracing off.
func traceSetup(t *testing.T, exp *tracetest.InMemoryExporter) *traceBundle {
	t.Helper()
	pool, _ := dbtest.Pool(t, 4)
	logs := &clitest.SyncBuffer{}
	log, err := logging.New(logs, "info", "api")
	require.NoError(t, err)
	svc, err := notes.NewService(pool, notes.Config{}, log)
	require.NoError(t, err)
	var tracer trace.Tracer
	if exp != nil {
		tracer = tracing.NewWithExporter(exp, "quill-api").Tracer()
	}
	tenant := "trace-" + testkit.UniqueSuffix()
	token, err := auth.Create(t.Context(), pool, tenant, time.Now())
	require.NoError(t, err)
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Deps{Pool: pool, Notes: svc, Log: log, Tracer: tracer}))
	t.Cleanup(srv.Close)
	return &traceBundle{t: t, srv: srv, token: token, logs: logs, stored: func(key string) (string, string) {
		var tp, ts *string
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT traceparent, tracestate FROM outbox_events WHERE operation_key = $1`, key).Scan(&tp, &ts))
		deref := func(s *string) string {
			if s == nil {
				return ""
			}
			return *s
		}
		return deref(tp), deref(ts)
	}}
}

func (b *traceBundle) create(key string, header http.Header) *http.Response {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/v1/notes", strings.NewReader(`{"title":"traced"}`))
	require.NoError(b.t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	require.NoError(b.t, res.Body.Close())
	return res
}

// A traced create is a server span named by its route, the child of the
// client's span, with the write's transaction as its child; the outbox
// row stores the server span's traceparent and the client's tracestate;
// the request's log line names the trace and the span.
func TestCreateIsATraceOfRequestAndTransaction(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	b := traceSetup(t, exp)
	res := b.create("traced-1", http.Header{"Traceparent": {clientTraceparent}, "Tracestate": {clientTracestate}})
	require.Equal(t, http.StatusCreated, res.StatusCode)

	spans := exp.GetSpans()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	server, ok := byName["POST /v1/notes"]
	require.True(t, ok, "spans: %v", spans)
	require.Equal(t, trace.SpanKindServer, server.SpanKind)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", server.SpanContext.TraceID().String(), "the client's trace")
	require.Equal(t, "00f067aa0ba902b7", server.Parent.SpanID().String(), "the client's span is the parent")
	require.Equal(t, clientTracestate, server.SpanContext.TraceState().String())
	attrs := map[string]any{}
	for _, kv := range server.Attributes {
		attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	require.Equal(t, "/v1/notes", attrs["http.route"])
	require.Equal(t, "POST", attrs["http.request.method"])
	require.EqualValues(t, http.StatusCreated, attrs["http.response.status_code"])
	require.Equal(t, "/v1/notes", attrs["url.path"])

	tx, ok := byName["transaction"]
	require.True(t, ok, "spans: %v", spans)
	require.Equal(t, server.SpanContext.SpanID(), tx.Parent.SpanID(), "the transaction is the request's child")
	require.Equal(t, server.SpanContext.TraceID(), tx.SpanContext.TraceID())
	require.Equal(t, codes.Unset, tx.Status.Code)

	tp, ts := b.stored("traced-1")
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+server.SpanContext.SpanID().String()+"-01", tp,
		"the event's publish will be the request span's child")
	require.Equal(t, clientTracestate, ts)

	lines := b.logs.Lines(t, "request")
	require.Len(t, lines, 1)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", lines[0]["trace_id"])
	require.Equal(t, server.SpanContext.SpanID().String(), lines[0]["span_id"])

	// Without a traceparent the request starts a trace of its own.
	res = b.create("traced-2", nil)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	tp, ts = b.stored("traced-2")
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, tp)
	require.NotContains(t, tp, "4bf92f3577b34da6a3ce929d0e0e4736")
	require.Empty(t, ts)
}

// A span holds nothing a caller invents or keeps secret: an operation
// key's lookup has url.path with the key REDACTED; an invented method is
// _OTHER in the span's name and attribute; an unmatched path and the user
// agent are capped.
func TestSpansHoldNoInventedOrSecretValues(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	b := traceSetup(t, exp)
	send := func(method, path, ua string) {
		t.Helper()
		req, err := http.NewRequest(method, b.srv.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+b.token)
		req.Header.Set("User-Agent", ua)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
	}
	secret := "key-that-must-not-be-recorded"
	send(http.MethodGet, "/v1/operations/"+secret, "agent/1")
	invented := "QUILL" + strings.Repeat("X", 2000)
	send(invented, "/v1/notes", "agent/1")
	long := "/" + strings.Repeat("p", 5000)
	send(http.MethodGet, long, strings.Repeat("u", 5000))

	spans := exp.GetSpans()
	require.Len(t, spans, 3)
	attrsOf := func(s tracetest.SpanStub) map[string]any {
		m := map[string]any{}
		for _, kv := range s.Attributes {
			m[string(kv.Key)] = kv.Value.AsInterface()
		}
		return m
	}
	for _, s := range spans {
		require.NotContains(t, fmt.Sprint(s.Name, s.Attributes), secret)
		require.NotContains(t, fmt.Sprint(s.Name, s.Attributes), "XXXX")
	}
	lookup := attrsOf(spans[0])
	require.Equal(t, "GET /v1/operations/{key}", spans[0].Name)
	require.Equal(t, "/v1/operations/REDACTED", lookup["url.path"])

	other := attrsOf(spans[1])
	require.Equal(t, "_OTHER /v1/notes", spans[1].Name)
	require.Equal(t, "_OTHER", other["http.request.method"])

	unmatched := attrsOf(spans[2])
	require.Equal(t, "GET", spans[2].Name)
	require.LessOrEqual(t, len(unmatched["url.path"].(string)), 260)
	require.True(t, strings.HasPrefix(unmatched["url.path"].(string), "/ppp"))
	require.LessOrEqual(t, len(unmatched["user_agent.original"].(string)), 260)
}

// With tracing off nothing changes: no span, the client's traceparent is
// stored as it came, with its tracestate, and a request's line names no
// trace. An invalid traceparent is stored as nothing, and so is the
// tracestate that came with it.
func TestTracingOffStoresTheClientsTraceContext(t *testing.T) {
	t.Parallel()
	b := traceSetup(t, nil)
	res := b.create("untraced-1", http.Header{"Traceparent": {clientTraceparent}, "Tracestate": {"rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE"}})
	require.Equal(t, http.StatusCreated, res.StatusCode)
	tp, ts := b.stored("untraced-1")
	require.Equal(t, clientTraceparent, tp)
	require.Equal(t, clientTracestate, ts, "the header's lines as one list")
	require.NotContains(t, b.logs.Lines(t, "request")[0], "trace_id")

	res = b.create("untraced-2", http.Header{"Traceparent": {"00-zz"}, "Tracestate": {"rojo=1"}})
	require.Equal(t, http.StatusCreated, res.StatusCode)
	tp, ts = b.stored("untraced-2")
	require.Empty(t, tp+ts)
}
