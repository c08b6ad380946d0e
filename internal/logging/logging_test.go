package logging_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/internal/logging"
)

func line(t *testing.T, buf *bytes.Buffer) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &m), buf.String())
	buf.Reset()
	return m
}

// A line logged with a span's context names its trace and span; one
// without a span context, or without a context, names neither.
func TestLineCarriesTraceIDOfItsSpan(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := logging.New(&buf, "info", "test")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	log.Info().Ctx(ctx).Msg("traced")
	m := line(t, &buf)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", m["trace_id"])
	require.Equal(t, "00f067aa0ba902b7", m["span_id"])
	require.Equal(t, "test", m["process"])

	log.Info().Ctx(context.Background()).Msg("no span")
	require.NotContains(t, line(t, &buf), "trace_id")
	log.Info().Msg("no context")
	require.NotContains(t, line(t, &buf), "trace_id")
}
