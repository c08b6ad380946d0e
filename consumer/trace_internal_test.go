package consumer

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

func TestTraceIDAndLogAttrs(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tc := range []struct {
		traceparent, want string
	}{
		{"00-" + id + "-00f067aa0ba902b7-01", id},
		{"00-" + id + "-00f067aa0ba902b7-00", id}, // not sampled: still the trace the publish belongs to
		{"", ""},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""}, // the all-zero id is invalid
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""}, // upper case is invalid
		{"00-" + id + "00f067aa0ba902b7-01", ""},
		{"garbage", ""},
	} {
		ev := Event{ID: "e1", Delivery: Delivery{Header: nats.Header{}}}
		if tc.traceparent != "" {
			ev.Delivery.Header.Set("traceparent", tc.traceparent)
		}
		require.Equal(t, tc.want, ev.TraceID(), tc.traceparent)
		want := []any{"event_id", "e1", "deliveries", 2}
		if tc.want != "" {
			want = append(want, "trace_id", tc.want)
		}
		require.Equal(t, want, ev.logAttrs("deliveries", 2), tc.traceparent)
	}
}
