package httpapi

import (
	"context"
	"net/http"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/internal/tracing"
)

// startSpan starts the request's server span, a child of the client's span
// when the request carries a valid traceparent (and its tracestate), and
// returns ctx with it. With tracing off (no Deps.Tracer) it returns ctx and
// a nil span: the request costs nothing more than before.
func (s *server) startSpan(ctx context.Context, r *http.Request) (context.Context, trace.Span) {
	if s.Tracer == nil {
		return ctx, nil
	}
	ctx = tracing.Extract(ctx, r.Header.Get("Traceparent"), requestTracestate(r))
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	// Named by the method until the route is known (endSpan), which also
	// sets url.path, redacted.
	method := s.methodLabel(r)
	return s.Tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		methodAttr(method), semconv.URLScheme(scheme),
		semconv.NetworkProtocolVersion(protocolVersion(r)), semconv.UserAgentOriginal(capped(r.UserAgent()))))
}

// maxSpanText bounds a span attribute taken from what the caller sent
// (the user agent, an unmatched path): headers may be 64 KiB.
const maxSpanText = 256

// capped is v cut to maxSpanText bytes, at a rune boundary, marked with "…"
// when cut, and made valid UTF-8.
func capped(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD")
	if len(v) <= maxSpanText {
		return v
	}
	cut := maxSpanText
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut] + "…"
}

// redactedPath is url.path for a request of route: the path as sent, but
// an operation key — which the API never records — replaced by REDACTED
// (OpenTelemetry's word for a value withheld), and an unmatched path
// capped.
func redactedPath(r *http.Request, route string) string {
	switch route {
	case operationsPattern:
		return operationsPrefix + "REDACTED"
	case "unmatched":
		return capped(r.URL.EscapedPath())
	}
	return r.URL.EscapedPath()
}

// endSpan names the request's span by its route, as OpenTelemetry's HTTP
// conventions do ("POST /v1/notes"), records the outcome and ends it. A
// server error marks it failed; a 4xx is the client's and does not.
func endSpan(span trace.Span, r *http.Request, method, route string, status int, ri *reqInfo) {
	if span == nil {
		return
	}
	if route != "unmatched" {
		span.SetName(method + " " + route)
		span.SetAttributes(semconv.HTTPRoute(route))
	}
	span.SetAttributes(semconv.URLPath(redactedPath(r, route)))
	span.SetAttributes(semconv.HTTPResponseStatusCode(status), attribute.String("quill.request_id", ri.id))
	if ri.tenant != "" {
		span.SetAttributes(attribute.String("quill.tenant", ri.tenant))
	}
	if ri.category != "" {
		span.SetAttributes(attribute.String("quill.error_category", ri.category))
	}
	if ri.replayed {
		span.SetAttributes(attribute.Bool("quill.replayed", true))
	}
	if status >= 500 {
		if ri.err != nil {
			span.RecordError(ri.err)
		}
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// traceContext returns the trace context a write stores with its outbox
// events, the parent of their publish: the request span's, or, with
// tracing off, the request's own valid traceparent as it came and its
// tracestate.
func (s *server) traceContext(r *http.Request) (parent, state string) {
	if s.Tracer != nil {
		return tracing.Inject(r.Context())
	}
	tp := traceparent(r)
	if tp == "" {
		return "", "" // a tracestate without its traceparent means nothing
	}
	ts, err := trace.ParseTraceState(requestTracestate(r))
	if err != nil {
		return tp, "" // invalid: W3C Trace Context has it ignored
	}
	return tp, ts.String()
}

// requestTracestate is the request's tracestate: every tracestate header
// line, joined as one list (W3C Trace Context §3.3.1.1).
func requestTracestate(r *http.Request) string {
	return strings.Join(r.Header.Values("Tracestate"), ",")
}

// methodAttr is http.request.method, _OTHER for a method HTTP does not
// define, so that a client cannot mint attribute values.
func methodAttr(m string) attribute.KeyValue {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return semconv.HTTPRequestMethodKey.String(m)
	}
	return semconv.HTTPRequestMethodOther
}

func protocolVersion(r *http.Request) string {
	switch {
	case r.ProtoMajor == 1 && r.ProtoMinor == 1:
		return "1.1"
	case r.ProtoMajor == 1 && r.ProtoMinor == 0:
		return "1.0"
	case r.ProtoMajor == 2:
		return "2"
	}
	return r.Proto
}
