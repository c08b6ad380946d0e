package idempotency

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// replayFlushTimeout bounds one flush, the final one at shutdown included.
const replayFlushTimeout = 5 * time.Second

// replayFlushChunk is how many operations one UPDATE statement touches.
const replayFlushChunk = 2000

// replayKey names one operation incarnation: a key forgotten and executed
// again is a new operation, told apart by its created_at (microseconds, as
// PostgreSQL stores it).
type replayKey struct {
	tenant, key string
	createdAt   int64
}

// replayCounter counts replays per operation in memory, so that answering a
// replay — from the cache, without a database round trip — costs a map
// increment; a flush adds the counts to operations.replays in one statement.
type replayCounter struct {
	mu     sync.Mutex
	counts map[replayKey]int64
}

func newReplayCounter() *replayCounter {
	return &replayCounter{counts: make(map[replayKey]int64)}
}

func (c *replayCounter) add(tenant, key string, createdAt time.Time) {
	k := replayKey{tenant: tenant, key: key, createdAt: createdAt.UnixMicro()}
	c.mu.Lock()
	c.counts[k]++
	c.mu.Unlock()
}

// take returns the counts so far and starts afresh.
func (c *replayCounter) take() map[replayKey]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.counts) == 0 {
		return nil
	}
	m := c.counts
	c.counts = make(map[replayKey]int64, len(m))
	return m
}

// giveBack returns counts a failed flush could not write, for the next one.
func (c *replayCounter) giveBack(m map[replayKey]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, n := range m {
		c.counts[k] += n
	}
}

// FlushReplays adds the replays counted since the last flush to their
// operations' replays column and returns how many replays it wrote. On
// failure the counts are kept for the next flush and the error (the
// driver's, wrapped) is returned.
func (p *Protocol) FlushReplays(ctx context.Context) (int64, error) {
	m := p.replays.take()
	if len(m) == 0 {
		return 0, nil
	}
	var written int64
	tenants := make([]string, 0, min(len(m), replayFlushChunk))
	keys := make([]string, 0, cap(tenants))
	created := make([]time.Time, 0, cap(tenants))
	ns := make([]int64, 0, cap(tenants))
	pending := make(map[replayKey]int64, cap(tenants))
	flush := func() error {
		if len(keys) == 0 {
			return nil
		}
		if err := AddReplays(ctx, p.pool, tenants, keys, created, ns); err != nil {
			return err
		}
		for _, n := range ns {
			written += n
		}
		tenants, keys, created, ns = tenants[:0], keys[:0], created[:0], ns[:0]
		clear(pending)
		return nil
	}
	for k, n := range m {
		tenants = append(tenants, k.tenant)
		keys = append(keys, k.key)
		created = append(created, time.UnixMicro(k.createdAt).UTC())
		ns = append(ns, n)
		pending[k] = n
		delete(m, k)
		if len(keys) == replayFlushChunk {
			if err := flush(); err != nil {
				p.replays.giveBack(pending)
				p.replays.giveBack(m)
				return written, fmt.Errorf("flush replay counts: %w", err)
			}
		}
	}
	if err := flush(); err != nil {
		p.replays.giveBack(pending)
		return written, fmt.Errorf("flush replay counts: %w", err)
	}
	return written, nil
}

// RunReplayCounter flushes the replay counts every ReplayFlushInterval until
// ctx ends, then flushes once more (on a context of its own, bounded) and
// returns nil. Run it for as long as the service answers requests and stop
// it after the last one: counts not flushed when the process dies (SIGKILL,
// a crash) are lost — at most one interval's worth. A failed flush is
// logged and retried at the next tick.
func (p *Protocol) RunReplayCounter(ctx context.Context) error {
	t := time.NewTicker(p.cfg.ReplayFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replayFlushTimeout)
			defer cancel()
			if _, err := p.FlushReplays(fctx); err != nil {
				p.log.Warn().Err(err).Str("error_category", "replay_count_lost").
					Msg("could not write the last replay counts at shutdown; they are lost (operations.replays undercounts)")
			}
			return nil
		case <-t.C:
			fctx, cancel := context.WithTimeout(ctx, replayFlushTimeout)
			if _, err := p.FlushReplays(fctx); err != nil && ctx.Err() == nil {
				p.log.Warn().Err(err).Str("error_category", "replay_count_flush_failed").
					Msg("could not write replay counts; retrying at the next flush")
			}
			cancel()
		}
	}
}
