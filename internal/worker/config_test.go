package worker_test

import (
	"testing"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/worker"
)

// TestConcurrencyBoundedByMaxAckPending: one process holds at most
// QUILL_WORKER_CONCURRENCY messages of the one pull consumer, so
// concurrency alone can go up to the consumer's MaxAckPending; above it
// the configuration is refused.
func TestConcurrencyBoundedByMaxAckPending(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                    string
		concurrency, maxPending int
		wantConcurrency         int
		valid                   bool
	}{
		{"defaults", 0, 0, worker.DefaultConcurrency, true},
		{"low concurrency", 4, 0, 4, true},
		{"above half of MaxAckPending", 600, 0, 600, true},
		{"exactly MaxAckPending", consumer.DefaultMaxAckPending, 0, consumer.DefaultMaxAckPending, true},
		{"above MaxAckPending is refused", consumer.DefaultMaxAckPending + 1, 0, consumer.DefaultMaxAckPending + 1, false},
		{"smaller MaxAckPending", 300, 256, 300, false},
		{"larger MaxAckPending", 2000, 2000, 2000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := worker.Config{Consumer: consumer.Config{Concurrency: tc.concurrency, MaxAckPending: tc.maxPending}}.WithDefaults()
			if c.Consumer.Concurrency != tc.wantConcurrency {
				t.Errorf("concurrency %d, want %d", c.Consumer.Concurrency, tc.wantConcurrency)
			}
			if err := c.Validate(); (err == nil) != tc.valid {
				t.Errorf("Validate() = %v, want valid %v", err, tc.valid)
			}
		})
	}
}
