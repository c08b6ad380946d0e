package worker_test

import (
	"testing"

	"github.com/quillhq/quill/internal/worker"
)

// TestPrefetchFollowsConcurrency: the pull-ahead per subscription shrinks
// as QUILL_WORKER_CONCURRENCY grows, so that concurrency alone can reach
// MaxAckPending; an explicit prefetch is kept and checked.
func TestPrefetchFollowsConcurrency(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                              string
		concurrency, prefetch, maxPending int
		wantConcurrency, wantPrefetch     int
		valid                             bool
	}{
		{"defaults", 0, 0, 0, worker.DefaultConcurrency, worker.DefaultPrefetch, true},
		{"defaults fill MaxAckPending", 0, 0, 0, 128, 2, true},
		{"low concurrency keeps the default", 4, 0, 0, 4, worker.DefaultPrefetch, true},
		{"above half of MaxAckPending pulls one", 200, 0, 0, 200, 1, true},
		{"exactly MaxAckPending", 256, 0, 0, 256, 1, true},
		{"above MaxAckPending is refused", 257, 0, 0, 257, 1, false},
		{"larger MaxAckPending", 200, 0, 1000, 200, 2, true},
		{"explicit prefetch kept", 64, 4, 0, 64, 4, true},
		{"explicit prefetch too large", 128, 4, 0, 128, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := worker.Config{Concurrency: tc.concurrency, Prefetch: tc.prefetch, MaxAckPending: tc.maxPending}.WithDefaults()
			if c.Concurrency != tc.wantConcurrency || c.Prefetch != tc.wantPrefetch {
				t.Errorf("concurrency %d prefetch %d, want %d and %d", c.Concurrency, c.Prefetch, tc.wantConcurrency, tc.wantPrefetch)
			}
			if err := c.Validate(); (err == nil) != tc.valid {
				t.Errorf("Validate() = %v, want valid %v", err, tc.valid)
			}
		})
	}
}
