package worker_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

var benchFixtures = []struct {
	name, contentType string
	data              []byte
}{
	{"png64k", "image/png", attachment.BenchFixturePNG64K()},
	{"text4k", "text/plain", attachment.BenchFixtureText4K()},
}

// benchConfig is the worker configuration of the benchmarks: the
// production defaults for concurrency and group commit, unless
// QUILL_WORKER_CONCURRENCY or the benchmark's own BENCH_WORKER_BATCH_SIZE,
// BENCH_WORKER_COMMITTERS and BENCH_WORKER_BATCH_WAIT (worker.BatchSize,
// Committers and BatchWait, constants of the program) say otherwise (make
// bench-worker passes them through).
func benchConfig(b *testing.B, h *harness) worker.Config {
	cfg := h.config()
	cfg.Consumer.Concurrency = 0
	cfg.Consumer.MaxAckPending = 1024
	cfg.Consumer.AckWait = 30 * time.Second
	for env, p := range map[string]*int{"QUILL_WORKER_CONCURRENCY": &cfg.Consumer.Concurrency,
		"BENCH_WORKER_BATCH_SIZE": &cfg.Consumer.MaxBatch, "BENCH_WORKER_COMMITTERS": &cfg.Consumer.MaxConcurrentBatches} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			require.NoError(b, err, env)
			*p = n
		}
	}
	if v := os.Getenv("BENCH_WORKER_BATCH_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err, "BENCH_WORKER_BATCH_WAIT")
		cfg.Consumer.MaxBatchWait = max(d, time.Nanosecond)
	}
	return cfg
}

// setupBench is a benchmark's harness and worker configuration: it creates
// b.N notes with data as attachment, waits until the relay published their
// note.created events and stops the relay.
func setupBench(b *testing.B, contentType string, data []byte) (*harness, worker.Config) {
	h := newHarness(b)
	for i := range b.N {
		h.create(title(i), contentType, data)
	}
	testkit.WaitFor(b, 5*time.Minute, func() bool {
		return h.count(`SELECT count(*) FROM outbox_events WHERE type = 'note.created' AND published_at IS NULL`) == 0
	}, "every note.created published")
	// The relay's other work — publishing the attachment.processed events
	// the worker writes — is not on the measured path (make bench-relay
	// measures it) and would compete for the same cores.
	h.stopRelay()
	return h, benchConfig(b, h)
}

// BenchmarkPipeline is the worker's whole path — JetStream delivery, inbox,
// row lock, processing, result and outbox writes, commit, ack — for the
// fixtures of attachment.BenchmarkProcess, so the two rates compare (make
// bench-worker). The b.N events are created and published before the timer
// starts; the timer covers the worker draining them. It reports
// attachments/s and the mean number of events per transaction.
func BenchmarkPipeline(b *testing.B) {
	for _, bc := range benchFixtures {
		b.Run(bc.name, func(b *testing.B) {
			h, cfg := setupBench(b, bc.contentType, bc.data)
			n := b.N
			b.ResetTimer()
			cpu := startCPU()
			start := time.Now()
			m, _ := h.startWorker(cfg, "")
			testkit.WaitFor(b, 10*time.Minute, func() bool { return testkit.Value(m.Messages(metrics.WorkerProcessed)) == float64(n) }, "all processed")
			elapsed := time.Since(start)
			b.StopTimer()
			batches, events, _ := h.workers[0].BatchStats()
			b.ReportMetric(float64(n)/elapsed.Seconds(), "attachments/s")
			b.ReportMetric(float64(events)/float64(max(batches, 1)), "events/tx")
			cpu.report(b, n)
		})
	}
}

// BenchmarkStoreCeiling is the same database work as BenchmarkPipeline —
// the same group-commit transactions (lock, inbox, processing, result,
// outbox event, commit) with the same batch size and number of
// connections — driven directly, without JetStream, the router or the
// handlers: the ceiling of what the pipeline could reach on this database
// (make bench-worker prints pipeline ÷ ceiling).
func BenchmarkStoreCeiling(b *testing.B) {
	for _, bc := range benchFixtures {
		b.Run(bc.name, func(b *testing.B) {
			h, cfg := setupBench(b, bc.contentType, bc.data)
			n := b.N
			rows, err := h.pool.Query(b.Context(), `SELECT payload FROM outbox_events WHERE type = 'note.created' ORDER BY seq`)
			require.NoError(b, err)
			var payloads [][]byte
			for rows.Next() {
				var p []byte
				require.NoError(b, rows.Scan(&p))
				payloads = append(payloads, p)
			}
			require.NoError(b, rows.Err())
			require.Len(b, payloads, n)
			pool, err := db.Open(b.Context(), h.url, int32(cfg.WithDefaults().Consumer.MaxConcurrentBatches+2))
			require.NoError(b, err)
			b.Cleanup(pool.Close)
			nc, _ := h.srv.Connect(b)
			w, err := worker.New(pool, nc, cfg, testkit.Logger(b), metrics.NewWorker(prometheus.NewRegistry()))
			require.NoError(b, err)
			b.ResetTimer()
			cpu := startCPU()
			start := time.Now()
			require.NoError(b, w.CommitPayloads(payloads))
			elapsed := time.Since(start)
			b.StopTimer()
			cpu.report(b, n)
			require.Equal(b, n, h.count(`SELECT count(*) FROM attachments WHERE status = 'processed'`))
			b.ReportMetric(float64(n)/elapsed.Seconds(), "attachments/s")
		})
	}
}

// cpuMark is the CPU time used so far by this process and by the machine.
type cpuMark struct{ process, machine float64 }

func startCPU() cpuMark { return cpuMark{measure.ProcessCPU(), measure.MachineCPU()} }

// report adds the CPU per event since m: "proc-µs/event" is this process —
// the worker and the in-process nats-server — and "machine-µs/event" every
// process, PostgreSQL's backends included (meaningful on an otherwise idle
// machine). Nothing is reported where /proc cannot be read.
func (m cpuMark) report(b *testing.B, events int) {
	now := startCPU()
	if m.process < 0 || now.process < 0 || m.machine < 0 || now.machine < 0 {
		return
	}
	b.ReportMetric((now.process-m.process)*1e6/float64(events), "proc-µs/event")
	b.ReportMetric((now.machine-m.machine)*1e6/float64(events), "machine-µs/event")
}
