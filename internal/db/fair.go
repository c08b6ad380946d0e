package db

import (
	"context"
	"sync"
)

// Fair shares n slots — a pool's connections — among keys (tenants). While
// one key is active (holds or waits for a slot) it may take all n. While k
// keys are active each may hold at most its share, ⌈n/k⌉, and the keys with
// a request waiting get freed slots in turns (round robin), not in arrival
// order. A tenant flooding the API up to its concurrency limit would
// otherwise hold every connection, and PostgreSQL would spend its CPU on the
// flood's transactions while every other tenant's request queued behind
// them. A slot beyond a key's share stays free for the others rather than
// going to the key over its share: the cost of fairness is that a busy
// tenant beside a quiet one may leave connections unused. Slots held when a
// key becomes active are not taken back; they count against the share once
// given back. Its methods are safe for concurrent use.
type Fair struct {
	mu     sync.Mutex
	n      int
	free   int
	held   map[string]int
	live   map[string]int             // per active key: slots held + requests waiting
	queues map[string][]chan struct{} // waiters per key, in arrival order
	order  []string                   // keys with waiters, whose turn is next first
}

// NewFair returns a Fair of n slots (at least 1).
func NewFair(n int) *Fair {
	n = max(1, n)
	return &Fair{n: n, free: n, held: make(map[string]int), live: make(map[string]int), queues: make(map[string][]chan struct{})}
}

// TryAcquire takes a slot for key when one is free and key is under its
// share, without waiting: the release function, or nil. A free slot with
// waiters behind it means they are over their shares (dispatch would have
// granted it otherwise), so key goes before none of them.
func (f *Fair) TryAcquire(key string) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.free == 0 || f.held[key] >= f.share(key) {
		return nil
	}
	f.live[key]++
	f.take(key)
	return f.releaseFunc(key)
}

// Acquire takes a slot for key, waiting for key's turn while none is free
// or key holds its share (TryAcquire first, to need no timer on ctx when
// it does not wait). It returns the function that gives the slot back
// (call it once; later calls do nothing), or ctx's error when ctx ends
// first; then no slot is held.
func (f *Fair) Acquire(ctx context.Context, key string) (release func(), err error) {
	f.mu.Lock()
	f.live[key]++
	if f.free > 0 && f.held[key] < f.share(key) {
		f.take(key)
		f.mu.Unlock()
		return f.releaseFunc(key), nil
	}
	turn := make(chan struct{}, 1)
	if len(f.queues[key]) == 0 {
		f.order = append(f.order, key)
	}
	f.queues[key] = append(f.queues[key], turn)
	f.mu.Unlock()

	select {
	case <-turn:
		return f.releaseFunc(key), nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	select {
	case <-turn:
		// Granted as ctx ended: give the slot back.
		f.mu.Unlock()
		f.release(key)
	default:
		f.dequeue(key, turn)
		f.leave(key)
		f.dispatch() // one key fewer may raise the others' shares
		f.mu.Unlock()
	}
	return nil, ctx.Err()
}

// share is the most slots key may hold now: ⌈n/k⌉ of the k active keys,
// key counted among them. Callers hold f.mu.
func (f *Fair) share(key string) int {
	k := len(f.live)
	if f.live[key] == 0 {
		k++
	}
	return (f.n + k - 1) / k
}

// leave counts one request of key as gone (given back, or given up).
// Callers hold f.mu.
func (f *Fair) leave(key string) {
	if f.live[key]--; f.live[key] <= 0 {
		delete(f.live, key)
	}
}

// take gives key a free slot. Callers hold f.mu.
func (f *Fair) take(key string) {
	f.free--
	f.held[key]++
}

func (f *Fair) releaseFunc(key string) func() {
	var once sync.Once
	return func() { once.Do(func() { f.release(key) }) }
}

// release gives key's slot back and hands free slots to waiters.
func (f *Fair) release(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.free++
	if f.held[key]--; f.held[key] <= 0 {
		delete(f.held, key)
	}
	f.leave(key)
	f.dispatch()
}

// dispatch grants free slots to the waiting keys under their shares, in
// turn: the first such key in the order gets one and goes to the back if
// it still waits. Callers hold f.mu.
func (f *Fair) dispatch() {
	for f.free > 0 {
		granted := false
		for i, key := range f.order {
			if f.held[key] >= f.share(key) {
				continue
			}
			q := f.queues[key]
			turn := q[0]
			f.order = append(f.order[:i:i], f.order[i+1:]...)
			if len(q) == 1 {
				delete(f.queues, key)
			} else {
				f.queues[key] = q[1:]
				f.order = append(f.order, key)
			}
			f.take(key)
			turn <- struct{}{}
			granted = true
			break
		}
		if !granted {
			return
		}
	}
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
