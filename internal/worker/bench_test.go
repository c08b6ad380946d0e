package worker_test

import (
	"testing"
	"time"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
)

// BenchmarkPipeline is the worker's whole path — JetStream delivery, inbox,
// row lock, processing, result and outbox writes, commit, ack — for the
// fixtures of attachment.BenchmarkProcess, so the two rates compare (make
// bench-worker). The b.N events are created and published before the timer
// starts; the timer covers the worker draining them. It reports
// attachments/s.
func BenchmarkPipeline(b *testing.B) {
	for _, bc := range []struct {
		name, contentType string
		data              []byte
	}{
		{"png64k", "image/png", attachment.BenchFixturePNG64K()},
		{"text4k", "text/plain", attachment.BenchFixtureText4K()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := newHarness(b)
			n := b.N
			for i := range n {
				h.create(title(i), bc.contentType, bc.data)
			}
			natstest.WaitFor(b, 5*time.Minute, func() bool {
				return h.count(`SELECT count(*) FROM outbox_events WHERE type = 'note.created' AND published_at IS NULL`) == 0
			}, "every note.created published")
			cfg := h.config()
			cfg.MaxAckPending = 1024
			cfg.AckWait = 30 * time.Second
			b.ResetTimer()
			start := time.Now()
			m, _ := h.startWorker(cfg, "")
			natstest.WaitFor(b, 10*time.Minute, func() bool { return value(m.Messages(metrics.WorkerProcessed)) == float64(n) }, "all processed")
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(n)/elapsed.Seconds(), "attachments/s")
		})
	}
}
