package db

import (
	"context"
	"sync"
)

// Fair shares n slots — a pool's connections — among keys (tenants) so
// that, when the slots are contended, each key with a request waiting gets
// its turn in round robin rather than in arrival order. A tenant that
// floods the API up to its concurrency limit would otherwise hold most of
// the pool, and every other tenant would queue behind its requests; under
// Fair it gets one turn per other waiting tenant's turn. A key alone is
// never held back: with nobody else waiting it may take every slot, so a
// fixed per-tenant cap's cost — a lone tenant using a fraction of the pool —
// is not paid. Its methods are safe for concurrent use.
type Fair struct {
	mu     sync.Mutex
	free   int
	queues map[string][]chan struct{} // waiters per key, in arrival order
	order  []string                   // keys with waiters, whose turn is next first
}

// NewFair returns a Fair of n slots (at least 1).
func NewFair(n int) *Fair {
	return &Fair{free: max(1, n), queues: make(map[string][]chan struct{})}
}

// Acquire takes a slot for key, waiting for key's turn while all are
// taken. It returns the function that gives the slot back (call it exactly
// once), or ctx's error when ctx ends first; then no slot is held.
func (f *Fair) Acquire(ctx context.Context, key string) (release func(), err error) {
	f.mu.Lock()
	if f.free > 0 { // then nobody waits: a release grants a waiter before it frees
		f.free--
		f.mu.Unlock()
		return f.releaseFunc(), nil
	}
	turn := make(chan struct{}, 1)
	if len(f.queues[key]) == 0 {
		f.order = append(f.order, key)
	}
	f.queues[key] = append(f.queues[key], turn)
	f.mu.Unlock()

	select {
	case <-turn:
		return f.releaseFunc(), nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	select {
	case <-turn:
		// Granted as ctx ended: pass the slot on.
		f.mu.Unlock()
		f.release()
	default:
		f.dequeue(key, turn)
		f.mu.Unlock()
	}
	return nil, ctx.Err()
}

func (f *Fair) releaseFunc() func() {
	var once sync.Once
	return func() { once.Do(f.release) }
}

// release hands the slot to the first waiter of the key whose turn it is,
// which then goes to the back of the order if it has more waiters, or
// frees it.
func (f *Fair) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.order) == 0 {
		f.free++
		return
	}
	key := f.order[0]
	f.order = f.order[1:]
	q := f.queues[key]
	turn := q[0]
	if len(q) == 1 {
		delete(f.queues, key)
	} else {
		f.queues[key] = q[1:]
		f.order = append(f.order, key)
	}
	turn <- struct{}{}
}

// dequeue removes a waiter that gave up. Callers hold f.mu.
func (f *Fair) dequeue(key string, turn chan struct{}) {
	q := f.queues[key]
	for i, c := range q {
		if c == turn {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) > 0 {
		f.queues[key] = q
		return
	}
	delete(f.queues, key)
	for i, k := range f.order {
		if k == key {
			f.order = append(f.order[:i:i], f.order[i+1:]...)
			break
		}
	}
}
