package worker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/worker"
)

// A message whose handling — a failed attempt, the in-process retry, a slow
// second attempt — outlasts AckWait is reported in progress throughout, so
// the server never redelivers it under the worker.
func TestInProgressCoversRetries(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Consumer.AckWait = time.Second
	cfg.Consumer.Retries = 2
	var (
		mu         sync.Mutex
		attempts   int
		deliveries []int
	)
	_, _ = h.startWorker(cfg, "", worker.WithHooks(worker.Hooks{BeforeProcess: func(_ string, delivery int) error {
		mu.Lock()
		attempts++
		n := attempts
		deliveries = append(deliveries, delivery)
		mu.Unlock()
		if n == 1 {
			// The first attempt fails at once; the retry middleware runs
			// the second after RetryInterval (20 ms).
			return errInjected
		}
		if n == 2 {
			// Outlasts two AckWaits: without progress reports during
			// the retry the server redelivers after one. A slow handler
			// is the subject here, not a wait.
			time.Sleep(2500 * time.Millisecond)
		}
		return nil
	}}))
	note := h.create("slow.txt", "text/plain", []byte("slow"))
	h.waitStatus(note, worker.StateProcessed)
	// A redelivery, had there been one, arrives within AckWait of the
	// last report; give it the time to show. Not a wait: nothing is to
	// happen, so there is no condition to poll for.
	time.Sleep(1500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 1}, deliveries, "two attempts of the first delivery, and no redelivery")
	require.Equal(t, 1, h.processedEvents(note))
}
