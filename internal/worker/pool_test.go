package worker_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// A worker of concurrency 128 reads its durable consumer through one pull
// request at a time — one pull consumer feeding a bounded pool — rather
// than one subscription, each with its pull requests, per concurrent
// handler: the server never sees more than one waiting pull request from
// it, idle or busy.
func TestOnePullRequestAtATime(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Consumer.Concurrency = 128
	m, _ := h.startWorker(cfg, "")
	waiting := func() int {
		c, err := h.js.Consumer(t.Context(), h.stream, cfg.Consumer.Durable)
		require.NoError(t, err)
		info, err := c.Info(t.Context())
		require.NoError(t, err)
		return info.NumWaiting
	}
	testkit.WaitFor(t, waitLong, func() bool { return waiting() >= 1 }, "the worker's pull request waiting")
	const n = 40
	ids := make([]uuid.UUID, n)
	for i := range n {
		ids[i] = h.create(title(i), "text/plain", []byte("pooled"))
	}
	most := 0
	testkit.WaitFor(t, waitLong, func() bool {
		most = max(most, waiting())
		return testkit.Value(m.Messages(metrics.WorkerProcessed)) == n
	}, "every event processed")
	for range 10 {
		most = max(most, waiting())
	}
	require.LessOrEqual(t, most, 1, "pull requests waiting at once")
}

// quill_worker_decode_memory_bytes is the decode weight admitted while an
// image is processed, and 0 once it is done.
func TestDecodeMemoryGauge(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	img := pngOf(t, 400, 300)
	g := metrics.NewDecodeMemory(prometheus.NewRegistry())
	release := make(chan struct{})
	held := make(chan float64, 1)
	_, _ = h.startWorker(h.config(), "", worker.WithDecodeMemoryGauge(g), worker.WithHooks(worker.Hooks{Processing: func(string) {
		held <- testkit.Value(g)
		<-release
	}}))
	require.Zero(t, testkit.Value(g))
	note := h.create("photo.png", "image/png", img)
	select {
	case v := <-held:
		require.Equal(t, float64(attachment.DecodeMemory(img)), v)
	case <-time.After(waitLong):
		t.Fatal("the image was not processed")
	}
	close(release)
	h.waitStatus(note, worker.StateProcessed)
	require.Zero(t, testkit.Value(g))
}
