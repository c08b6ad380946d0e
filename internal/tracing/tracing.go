// Package tracing is Quill's OpenTelemetry tracing: the TracerProvider a
// process builds from the standard OTEL_* environment — off, a nil tracer
// that the instrumented packages skip, when no variable enables it — and
// the W3C Trace Context (traceparent and tracestate) carried from an HTTP
// request through the outbox row and the NATS message to a consumer.
//
// The instrumented packages take a trace.Tracer that is nil when tracing
// is off: they then do today's work and nothing more (the relay copies the
// stored traceparent and tracestate into its message as they are), so that
// an untraced deployment pays for no span, no context and no exporter.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/internal/buildinfo"
)

// Scope is the instrumentation scope of Provider.Tracer's spans: the
// module, so that a backend tells Quill's spans from a library's.
const Scope = "github.com/quillhq/quill"

// Provider is a process's tracing. The zero value, and the Provider New
// returns when no OTEL_* variable enables tracing, is off.
type Provider struct {
	sdk *sdktrace.TracerProvider // nil when off
	// exporter says where spans go, for the start-up log line.
	exporter string
}

// Process is what New needs to know of the process.
type Process struct {
	// Service is the service.name of its spans unless OTEL_SERVICE_NAME
	// or OTEL_RESOURCE_ATTRIBUTES names one: quill-api, quill-relay.
	Service string
	// Stdout receives the spans of OTEL_TRACES_EXPORTER=console (nil:
	// they are dropped).
	Stdout io.Writer
	// OnError is told of every failure to export spans (a collector
	// down): OpenTelemetry's error handler, which is process-wide, so the
	// last New that turned tracing on is told. Nil leaves OpenTelemetry's
	// default, a line through the standard library's log package.
	OnError func(error)
}

// New builds the process's tracing from the standard OpenTelemetry
// environment, read through getenv (see readSettings for the variables
// Quill reads): spans go to an OTLP/HTTP collector, or as JSON to
// p.Stdout with OTEL_TRACES_EXPORTER=console. Tracing is off — no
// exporter, no goroutine, Tracer returns nil — unless OTEL_TRACES_EXPORTER
// or an OTLP endpoint variable asks for it, and whenever OTEL_SDK_DISABLED
// is true. It connects to nothing: the first export does. It returns an
// error naming the variable when one is invalid; nothing is started then.
func New(ctx context.Context, getenv func(string) string, p Process) (*Provider, error) {
	s, err := readSettings(getenv, p.Service)
	if err != nil || s.exporter == "" {
		return &Provider{}, err
	}
	var exp sdktrace.SpanExporter
	desc := s.exporter
	switch s.exporter {
	case exporterConsole:
		w := p.Stdout
		if w == nil {
			w = io.Discard
		}
		exp, err = stdouttrace.New(stdouttrace.WithWriter(w))
	case exporterOTLP:
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(s.endpoint), otlptracehttp.WithTimeout(s.timeout)}
		if len(s.headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(s.headers))
		}
		if s.gzip {
			opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
		desc += " " + s.endpoint
	}
	if err != nil {
		return &Provider{}, fmt.Errorf("trace exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceVersion(buildinfo.Read().Version)),
		resource.WithAttributes(s.resource...),
		resource.WithAttributes(semconv.ServiceName(s.service)))
	if err != nil {
		return &Provider{}, fmt.Errorf("trace resource: %w", err)
	}
	if p.OnError != nil {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(p.OnError))
	}
	return &Provider{exporter: desc, sdk: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(s.sampler), sdktrace.WithResource(res))}, nil
}

// NewWithExporter returns tracing on that hands every ended span to exp at
// once, every trace sampled: for tests with tracetest's in-memory exporter.
func NewWithExporter(exp sdktrace.SpanExporter, service string) *Provider {
	res := resource.NewSchemaless(semconv.ServiceName(service))
	return &Provider{exporter: "test", sdk: sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))}
}

// Exporter says where the spans go — "otlp <endpoint URL>", "console" —
// and is "" when tracing is off.
func (p *Provider) Exporter() string {
	if !p.Enabled() {
		return ""
	}
	return p.exporter
}

// Enabled reports whether tracing is on.
func (p *Provider) Enabled() bool { return p != nil && p.sdk != nil }

// Tracer returns Quill's tracer, or nil when tracing is off: the packages
// that take a tracer read nil as off.
func (p *Provider) Tracer() trace.Tracer {
	if !p.Enabled() {
		return nil
	}
	return p.sdk.Tracer(Scope)
}

// Shutdown exports the spans not sent yet and stops the exporter, waiting
// at most until ctx ends; with tracing off it does nothing. It returns the
// exporter's error, or ctx's when the flush did not finish.
func (p *Provider) Shutdown(ctx context.Context) error {
	if !p.Enabled() {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("shut tracing down: %w", err)
	}
	return nil
}

// ShutdownTimeout bounds the final flush of a process's spans at exit.
const ShutdownTimeout = 5 * time.Second

// Close is Shutdown bounded by ShutdownTimeout, for a process's exit.
func (p *Provider) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	return p.Shutdown(ctx)
}

// Header is a carrier of trace context through message headers — a NATS
// message's nats.Header, a consumer.Event's Delivery.Header — under the
// exact names traceparent and tracestate, where propagation.HeaderCarrier
// would write HTTP's canonical Traceparent, which NATS keeps as written.
type Header map[string][]string

// Get returns the first value of key.
func (h Header) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key with value.
func (h Header) Set(key, value string) { h[key] = []string{value} }

// Keys lists the header names.
func (h Header) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

var _ propagation.TextMapCarrier = Header(nil)

// pair is a carrier of one traceparent and one tracestate, as a row stores
// them.
type pair struct{ traceparent, tracestate string }

func (p *pair) Get(key string) string {
	switch key {
	case "traceparent":
		return p.traceparent
	case "tracestate":
		return p.tracestate
	}
	return ""
}

func (p *pair) Set(key, value string) {
	switch key {
	case "traceparent":
		p.traceparent = value
	case "tracestate":
		p.tracestate = value
	}
}

func (p *pair) Keys() []string { return []string{"traceparent", "tracestate"} }

// Inject returns the traceparent and tracestate of the span in ctx, both ""
// when ctx holds no valid span context.
func Inject(ctx context.Context) (traceparent, tracestate string) {
	var p pair
	propagation.TraceContext{}.Inject(ctx, &p)
	return p.traceparent, p.tracestate
}

// InjectHeader sets h's traceparent and tracestate to the span in ctx's;
// it sets nothing when ctx holds no valid span context.
func InjectHeader(ctx context.Context, h Header) { propagation.TraceContext{}.Inject(ctx, h) }

// Extract returns ctx with the remote span context that traceparent and
// tracestate name as the parent of the spans started from it; ctx itself
// when traceparent is not valid (a tracestate without a valid traceparent
// is ignored, as W3C Trace Context requires).
func Extract(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, &pair{traceparent: traceparent, tracestate: tracestate})
}

// StartConsumerSpan starts the span of a consumer's handling of a message
// whose header carries the publish's trace context: a consumer span, child
// of the publish span, named name. With tracer nil (tracing off) it starts
// nothing and returns ctx with the message's trace context as its remote
// span, so that what the handling writes (an outbox event's traceparent)
// still carries the trace on; the span returned is then not recording.
// Either way the caller ends the span.
func StartConsumerSpan(ctx context.Context, tracer trace.Tracer, header Header, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx = propagation.TraceContext{}.Extract(ctx, header)
	if tracer == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	return tracer.Start(ctx, name, append([]trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}, opts...)...)
}

// errUnsupported is wrapped by the errors of settings Quill does not
// implement.
var errUnsupported = errors.New("not supported")
