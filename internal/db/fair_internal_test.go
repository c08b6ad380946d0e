package db

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/testkit"
)

// waiting is how many requests of key wait for a turn.
func (f *Fair) waiting(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.queues[key])
}

// When the slots are contended, the keys with waiters take turns: a key
// that queued many requests first does not go before another key's one
// request more than once.
func TestFairTakesTurnsAmongKeys(t *testing.T) {
	t.Parallel()
	f := NewFair(1)
	hold, err := f.Acquire(t.Context(), "flood")
	require.NoError(t, err)

	granted := make(chan string, 4)
	enqueue := func(key, name string, before int) {
		go func() {
			rel, err := f.Acquire(t.Context(), key)
			if err != nil {
				granted <- "error: " + err.Error()
				return
			}
			granted <- name
			rel()
		}()
		testkit.WaitFor(t, 5*time.Second, func() bool { return f.waiting(key) == before+1 }, name+" waiting")
	}
	// Each grant is released at once, so the order of grants is the order
	// of turns; the waiters queue one by one so that their arrival order
	// is known.
	enqueue("flood", "flood-1", 0)
	enqueue("flood", "flood-2", 1)
	enqueue("flood", "flood-3", 2)
	enqueue("agent", "agent-1", 0)
	hold()
	var order []string
	for range 4 {
		order = append(order, <-granted)
	}
	require.Equal(t, []string{"flood-1", "agent-1", "flood-2", "flood-3"}, order,
		"arrival order would have been flood-1, flood-2, flood-3, agent-1")
}

// While two keys are active each holds at most half the slots: a key over
// its share waits even with a slot free, which the other key takes at once;
// once the other key is gone, the first may take every slot again.
func TestFairKeepsEachKeyToItsShare(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := NewFair(4)
	var flood []func()
	for range 4 {
		rel, err := f.Acquire(ctx, "flood")
		require.NoError(t, err)
		flood = append(flood, rel)
	}
	agent := make(chan func(), 1)
	go func() {
		rel, err := f.Acquire(ctx, "agent")
		if err == nil {
			agent <- rel
		}
	}()
	testkit.WaitFor(t, 5*time.Second, func() bool { return f.waiting("agent") == 1 }, "the agent waiting")
	flood[0]()
	a1 := <-agent // the freed slot goes to the agent

	f5 := make(chan func(), 1)
	go func() {
		rel, err := f.Acquire(ctx, "flood")
		if err == nil {
			f5 <- rel
		}
	}()
	testkit.WaitFor(t, 5*time.Second, func() bool { return f.waiting("flood") == 1 }, "a fifth flood request waiting")
	flood[1]() // the flood holds 2 of 4 now: its share
	f.mu.Lock()
	free := f.free
	f.mu.Unlock()
	require.Equal(t, 1, free, "the slot stays free rather than go to the flood over its share")
	require.Equal(t, 1, f.waiting("flood"))
	a2, err := f.Acquire(ctx, "agent")
	require.NoError(t, err, "the agent, under its share, takes the free slot at once")
	a1()
	a2()
	(<-f5)() // the agent gone, the flood's share is every slot
	flood[2]()
	flood[3]()
}

// A key alone may take every slot.
func TestFairLoneKeyTakesEverySlot(t *testing.T) {
	t.Parallel()
	f := NewFair(3)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	for i := range 3 {
		_, err := f.Acquire(ctx, "alone")
		require.NoError(t, err, "slot %d", i)
	}
	short, cancelShort := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancelShort()
	_, err := f.Acquire(short, "alone")
	require.ErrorIs(t, err, context.DeadlineExceeded, "a fourth waits")
}

// A waiter whose context ends holds nothing and loses no slot, also when
// it was granted the slot as its context ended; a release is idempotent.
func TestFairGivingUpLosesNoSlot(t *testing.T) {
	t.Parallel()
	f := NewFair(1)
	hold, err := f.Acquire(t.Context(), "a")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := f.Acquire(ctx, "b")
		errc <- err
	}()
	testkit.WaitFor(t, 5*time.Second, func() bool { return f.waiting("b") == 1 }, "b waiting")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.Zero(t, f.waiting("b"))
	hold()
	hold() // a second call does nothing
	again, err := f.Acquire(t.Context(), "c")
	require.NoError(t, err, "the slot is free again")
	short, cancelShort := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancelShort()
	_, err = f.Acquire(short, "d")
	require.ErrorIs(t, err, context.DeadlineExceeded, "the double release freed no second slot")
	again()
}

// Under concurrent use no more than n slots are ever held, every request
// is served, and nothing is held at the end.
func TestFairConcurrent(t *testing.T) {
	t.Parallel()
	const n = 4
	f := NewFair(n)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			ctx := t.Context()
			if i%7 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(i%3)*time.Millisecond)
				defer cancel()
			}
			rel, err := f.Acquire(ctx, fmt.Sprint("k", i%5))
			if err != nil {
				return
			}
			h := held.Add(1)
			for p := peak.Load(); h > p && !peak.CompareAndSwap(p, h); p = peak.Load() {
			}
			time.Sleep(100 * time.Microsecond)
			held.Add(-1)
			rel()
		})
	}
	wg.Wait()
	require.LessOrEqual(t, peak.Load(), int64(n))
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, n, f.free, "every slot back")
	require.Empty(t, f.held)
	require.Empty(t, f.live)
	require.Empty(t, f.order)
	require.Empty(t, f.queues)
}
