package worker_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// Two workers whose pools reach PostgreSQL through PgBouncer in transaction
// mode (a pool of fewer backends than their connections) process images
// and texts in group commits, each once, and their attachment.processed
// events reach the stream through the (direct) relay.
func TestWorkersThroughPgBouncer(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	pooled := dbtest.PgBouncerWith(t, h.url, dbtest.PgBouncerConfig{PoolSize: 3})
	cfg := h.config()
	m1, _ := h.startWorker(cfg, pooled)
	m2, _ := h.startWorker(cfg, pooled)
	const n = 40
	ids := make([]uuid.UUID, 0, n)
	for i := range n {
		if i%4 == 0 {
			ids = append(ids, h.create(title(i), "image/png", pngOf(t, 300, 200)))
		} else {
			ids = append(ids, h.create(title(i), "text/plain", []byte("one two three")))
		}
	}
	testkit.WaitFor(t, waitLong, func() bool {
		return h.count(`SELECT count(*) FROM attachments WHERE status = $1`, worker.StateProcessed) == n
	}, "every attachment processed")
	for _, id := range ids {
		require.Equal(t, 1, h.processedEvents(id))
	}
	require.Equal(t, n, h.count(`SELECT count(*) FROM quill_consumer_inbox`))
	testkit.WaitFor(t, waitLong, func() bool {
		return len(natstest.StreamMessages(t, h.js, h.stream, h.prefix+".*.attachment.processed")) == n
	}, "every attachment.processed event published")
	processed := func() float64 {
		return testkit.Value(m1.Messages(metrics.WorkerProcessed)) + testkit.Value(m2.Messages(metrics.WorkerProcessed))
	}
	require.Equal(t, float64(n), processed())
}
