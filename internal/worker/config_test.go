package worker_test

import (
	"testing"

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
		{"above half of MaxAckPending", 200, 0, 200, true},
		{"exactly MaxAckPending", 256, 0, 256, true},
		{"above MaxAckPending is refused", 257, 0, 257, false},
		{"larger MaxAckPending", 1000, 1000, 1000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := worker.Config{Concurrency: tc.concurrency, MaxAckPending: tc.maxPending}.WithDefaults()
			if c.Concurrency != tc.wantConcurrency {
				t.Errorf("concurrency %d, want %d", c.Concurrency, tc.wantConcurrency)
			}
			if err := c.Validate(); (err == nil) != tc.valid {
				t.Errorf("Validate() = %v, want valid %v", err, tc.valid)
			}
		})
	}
}
