package db_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// The transaction both benchmarks send: a create's shape in small — its
// own lock_timeout, then one insert.
const (
	benchGroupInsert      = "INSERT INTO bench_group (v) VALUES ($1)"
	benchGroupLockTimeout = 5 * time.Second
)

// BenchmarkGroup sends b.N small insert transactions through a Group from
// 1, GOMAXPROCS×4 and 64 goroutines; BenchmarkPipelineOneByOne sends the
// same transactions one Pipeline each (BEGIN, lock timeout, insert, COMMIT
// in one round trip). Both report the process's CPU per transaction
// (getrusage, user+system), transactions per second and the p99 of a
// caller's wait; compare them with benchstat over interleaved runs.
func BenchmarkGroup(b *testing.B) { benchGroup(b, db.GroupConfig{}) }

// BenchmarkGroupBarrier is BenchmarkGroup with CommitBarrier: one WAL
// flush per write of several transactions.
func BenchmarkGroupBarrier(b *testing.B) { benchGroup(b, db.GroupConfig{CommitBarrier: true}) }

func benchGroup(b *testing.B, cfg db.GroupConfig) {
	benchClients(b, func(b *testing.B, pool *pgxpool.Pool) func(context.Context) error {
		g, err := db.NewGroup(pool, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			st := g.Stats()
			if st.Flushes > 0 {
				b.ReportMetric(float64(st.Txs)/float64(st.Flushes), "tx/flush")
			}
			g.Close()
		})
		return func(ctx context.Context) error {
			return g.Do(ctx, &db.GroupTx{LockTimeout: benchGroupLockTimeout, Stmts: []db.GroupStmt{{SQL: benchGroupInsert, Args: []any{"x"}}}})
		}
	})
}

// BenchmarkPipelineOneByOne is BenchmarkGroup's baseline: see there.
func BenchmarkPipelineOneByOne(b *testing.B) {
	benchClients(b, func(b *testing.B, pool *pgxpool.Pool) func(context.Context) error {
		return func(ctx context.Context) error {
			p, err := db.BeginPipeline(ctx, pool, db.WithLockTimeout(benchGroupLockTimeout))
			if err != nil {
				return err
			}
			defer p.Release()
			p.Batch().Queue(benchGroupInsert, "x")
			return p.Commit(ctx)
		}
	})
}

// benchClients runs the transaction that setup returns from each number of
// goroutines, on a pool of 16 connections (the API's).
func benchClients(b *testing.B, setup func(*testing.B, *pgxpool.Pool) func(context.Context) error) {
	u := dbtest.Schema(b)
	procs := runtime.GOMAXPROCS(0)
	for _, clients := range []int{1, procs * 4, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			ctx := b.Context()
			pool, err := db.Open(ctx, u, 16)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS bench_group (id bigserial PRIMARY KEY, v text NOT NULL)"); err != nil {
				b.Fatal(err)
			}
			run := setup(b, pool)
			// Warm every connection's statements before measuring.
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					if err := run(ctx); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			b.ReportAllocs()
			var (
				mu    sync.Mutex
				waits []time.Duration
			)
			cpu0 := processCPU(b)
			b.ResetTimer()
			start := time.Now()
			// RunParallel starts parallelism×GOMAXPROCS goroutines; the
			// work of b.N is shared among them.
			b.SetParallelism(max(1, clients/procs))
			if clients < procs {
				// One client: a loop of its own.
				mine := make([]time.Duration, 0, b.N)
				for range b.N {
					t0 := time.Now()
					if err := run(ctx); err != nil {
						b.Fatal(err)
					}
					mine = append(mine, time.Since(t0))
				}
				waits = mine
			} else {
				b.RunParallel(func(pb *testing.PB) {
					var mine []time.Duration
					for pb.Next() {
						t0 := time.Now()
						if err := run(ctx); err != nil {
							b.Error(err)
							return
						}
						mine = append(mine, time.Since(t0))
					}
					mu.Lock()
					waits = append(waits, mine...)
					mu.Unlock()
				})
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cpu := processCPU(b) - cpu0
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "tx/s")
			if len(waits) > 0 {
				slices.Sort(waits)
				b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}

// processCPU is the CPU the test process has used so far, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
