package tracing_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/quillhq/quill/internal/tracing"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// provider that is off starts none, and Shutdown stops an exporter's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

const (
	parentTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	parentTracestate  = "quill=t61rcWkgMzE,rojo=00f067aa0ba902b7"
)

// With no OTEL_* variable — or with ones that name no destination — tracing
// is off: no tracer, no exporter, nothing to flush.
func TestNewIsOffWithoutOTELVariables(t *testing.T) {
	t.Parallel()
	for _, vars := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "api", "OTEL_TRACES_SAMPLER": "always_on", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"},
		{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
		{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"},
	} {
		p, err := tracing.New(t.Context(), env(vars), tracing.Process{Service: "quill-test", Stdout: io.Discard})
		require.NoError(t, err, "%v", vars)
		require.False(t, p.Enabled(), "%v", vars)
		require.Nil(t, p.Tracer(), "%v: the instrumented packages read a nil tracer as off", vars)
		require.Empty(t, p.Exporter())
		require.NoError(t, p.Shutdown(t.Context()))
	}
}

func TestNewRefusesInvalidSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://collector/v1/traces"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "5s"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "api-key"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "a=%zz"}, "OTEL_RESOURCE_ATTRIBUTES"},
	} {
		p, err := tracing.New(t.Context(), env(tc.vars), tracing.Process{Service: "quill-test", Stdout: io.Discard})
		require.ErrorContains(t, err, tc.want, "%v", tc.vars)
		require.False(t, p.Enabled())
	}
}

// collector is an OTLP/HTTP receiver that counts the exports it is sent.
type collector struct {
	mu      sync.Mutex
	posts   []string // path and content type of each
	headers []http.Header
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	c.mu.Lock()
	c.posts = append(c.posts, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
	c.headers = append(c.headers, r.Header.Clone())
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// An OTLP endpoint turns tracing on; spans are batched, and Shutdown
// flushes them to the collector, with the configured headers, at the
// traces path.
func TestNewExportsOverOTLPHTTPAndShutdownFlushes(t *testing.T) {
	t.Parallel()
	c := &collector{}
	srv := httptest.NewServer(c)
	defer srv.Close()
	p, err := tracing.New(t.Context(), env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL + "/",
		"OTEL_EXPORTER_OTLP_HEADERS":  "Authorization=Bearer%20xyz",
		"OTEL_SERVICE_NAME":           "quill-api-test",
	}), tracing.Process{Service: "quill-test", Stdout: io.Discard})
	require.NoError(t, err)
	require.True(t, p.Enabled())
	require.Equal(t, "otlp "+srv.URL+"/v1/traces", p.Exporter())
	_, span := p.Tracer().Start(t.Context(), "work")
	require.True(t, span.IsRecording())
	span.End()
	c.mu.Lock()
	require.Empty(t, c.posts, "spans are batched, not sent one by one")
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.Shutdown(ctx))
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Equal(t, []string{"POST /v1/traces application/x-protobuf"}, c.posts)
	require.Equal(t, "Bearer xyz", c.headers[0].Get("Authorization"))
}

// OTEL_TRACES_EXPORTER=console writes the spans as JSON to the process's
// stdout, with the service name of OTEL_SERVICE_NAME.
func TestConsoleExporterWritesToStdout(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	p, err := tracing.New(t.Context(), env(map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "quill-console"}), tracing.Process{Service: "quill-test", Stdout: &out})
	require.NoError(t, err)
	_, span := p.Tracer().Start(t.Context(), "console-work")
	span.End()
	require.NoError(t, p.Shutdown(t.Context()))
	require.Contains(t, out.String(), `"Name":"console-work"`)
	require.Contains(t, out.String(), `"quill-console"`)
}

// The trace context of a span survives a row's two columns: a span started
// from what was stored is its child, in its trace, with its tracestate.
func TestInjectExtractKeepsTracestate(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tracer := tracing.NewWithExporter(exp, "test").Tracer()

	ctx := tracing.Extract(t.Context(), parentTraceparent, parentTracestate)
	ctx, span := tracer.Start(ctx, "request")
	tp, ts := tracing.Inject(ctx)
	require.Regexp(t, `^00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]{16}-01$`, tp)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+span.SpanContext().SpanID().String()+"-01", tp, "the span's own id")
	require.Equal(t, parentTracestate, ts)
	span.End()

	_, child := tracer.Start(tracing.Extract(context.Background(), tp, ts), "publish")
	child.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	require.Equal(t, spans[0].SpanContext.SpanID(), spans[1].Parent.SpanID())
	require.Equal(t, parentTracestate, spans[1].SpanContext.TraceState().String())

	tp, ts = tracing.Inject(context.Background())
	require.Empty(t, tp+ts, "no span, nothing to store")
	require.Equal(t, t.Context(), tracing.Extract(t.Context(), "", "rojo=1"), "no traceparent: nothing extracted")
	require.False(t, trace.SpanContextFromContext(tracing.Extract(t.Context(), "00-zz", "")).IsValid())
}

// A consumer's span is a child of the publish span whose context the
// message's header carries, under NATS's exact header names.
func TestStartConsumerSpanIsAChildOfThePublish(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tracer := tracing.NewWithExporter(exp, "test").Tracer()
	pctx, publish := tracer.Start(tracing.Extract(t.Context(), parentTraceparent, parentTracestate), "send", trace.WithSpanKind(trace.SpanKindProducer))
	h := tracing.Header{"Nats-Msg-Id": {"e1"}}
	tracing.InjectHeader(pctx, h)
	publish.End()
	require.Equal(t, []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-" + publish.SpanContext().SpanID().String() + "-01"}, h["traceparent"])
	require.Equal(t, []string{parentTracestate}, h["tracestate"])

	ctx, span := tracing.StartConsumerSpan(t.Context(), tracer, h, "process")
	require.True(t, span.IsRecording())
	span.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	consumer := spans[1]
	require.Equal(t, trace.SpanKindConsumer, consumer.SpanKind)
	require.Equal(t, publish.SpanContext().SpanID(), consumer.Parent.SpanID())
	require.True(t, consumer.Parent.IsRemote())
	require.Equal(t, publish.SpanContext().TraceID(), consumer.SpanContext.TraceID())
	require.Equal(t, parentTracestate, consumer.SpanContext.TraceState().String())
	tp, _ := tracing.Inject(ctx)
	require.Contains(t, tp, consumer.SpanContext.SpanID().String(), "what the handling writes names its span")

	// Tracing off: no span, but the message's trace context goes on.
	ctx, span = tracing.StartConsumerSpan(t.Context(), nil, h, "process")
	require.False(t, span.IsRecording())
	span.End()
	tp, ts := tracing.Inject(ctx)
	require.Equal(t, h["traceparent"][0], tp)
	require.Equal(t, parentTracestate, ts)
	require.Len(t, exp.GetSpans(), 2, "nothing recorded with tracing off")
}

// A collector that refuses the spans is reported to OnError, not written
// to stderr by OpenTelemetry's default handler.
func TestExportFailuresGoToOnError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusBadRequest) // not retried
	}))
	defer srv.Close()
	var mu sync.Mutex
	var errs []error
	p, err := tracing.New(t.Context(), env(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/v1/traces"}),
		tracing.Process{Service: "quill-test", OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }})
	require.NoError(t, err)
	_, span := p.Tracer().Start(t.Context(), "work")
	span.End()
	_ = p.Close()
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, errs)
	require.ErrorContains(t, errs[0], "400")
}
