package relay

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/internal/outbox"
)

// TestRefusal: which JetStream answers park an event. Codes and error
// codes as nats-server v2.15 sends them (server/errors.json).
func TestRefusal(t *testing.T) {
	t.Parallel()
	api := func(code int, errCode jetstream.ErrorCode, desc string) error {
		return &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc}
	}
	for _, tc := range []struct {
		name      string
		err       error
		permanent bool
	}{
		{"message too large for the stream", api(400, 10054, "message size exceeds maximum allowed"), true},
		{"bad request", api(400, 10003, "bad request"), true},
		{"wrapped refusal", fmt.Errorf("publish: %w", api(400, 10054, "message size exceeds maximum allowed")), true},
		{"duplicate message id in process", api(409, 10158, "duplicate message id is in process"), false},
		{"too many requests", api(429, 10167, "too many requests"), false},
		{"wrapped duplicate in process", fmt.Errorf("publish: %w", api(409, 10158, "duplicate message id is in process")), false},
		{"JetStream unavailable", api(503, 10008, "JetStream system temporarily unavailable"), false},
		{"store failed", api(503, 10077, "disk full"), false},
		{"no responders", nats.ErrNoResponders, false},
		{"timeout", nats.ErrTimeout, false},
		{"other error", errors.New("connection reset"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reason, permanent := refusal(tc.err)
			if permanent != tc.permanent {
				t.Fatalf("refusal(%v) = %q, %v; want permanent %v", tc.err, reason, permanent, tc.permanent)
			}
			if permanent && reason == "" {
				t.Error("a refusal without a reason")
			}
		})
	}
}

// TestStreamMissing: which publish answers mean the stream is gone, to be
// provisioned again rather than the event parked.
func TestStreamMissing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     error
		missing bool
	}{
		{"no responders", nats.ErrNoResponders, true},
		{"no stream response", jetstream.ErrNoStreamResponse, true},
		{"wrapped no responders", fmt.Errorf("publish: %w", nats.ErrNoResponders), true},
		{"stream not found", &jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound, Description: "stream not found"}, true},
		{"message too large", &jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "message size exceeds maximum allowed"}, false},
		{"timeout", nats.ErrTimeout, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := streamMissing(tc.err); got != tc.missing {
				t.Fatalf("streamMissing(%v) = %v; want %v", tc.err, got, tc.missing)
			}
			if tc.missing {
				if _, permanent := (&Relay{}).permanent(t.Context(), outbox.Pending{}, tc.err); permanent {
					t.Fatalf("%v parks its event", tc.err)
				}
			}
		})
	}
}
