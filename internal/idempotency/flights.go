package idempotency

import "sync"

// Flights coalesces concurrent requests for one operation inside a process:
// the first to join executes, the others wait on a channel — holding no
// database connection — until it is done and then read its outcome. Across
// processes the advisory lock decides; Flights only spares the database the
// contention.
type Flights struct {
	mu sync.Mutex
	m  map[int64]*flight
}

type flight struct {
	// done is made when the first follower joins, and closed when the
	// leader leaves: most operations have none, and a channel was one of
	// the allocations of every create (issue 29).
	done   chan struct{}
	action string
	left   bool
}

// NewFlights returns an empty set of flights.
func NewFlights() *Flights {
	return &Flights{m: make(map[int64]*flight)}
}

// Join enters the flight for operation id, on behalf of a request for
// action. When nobody is in it, the caller leads: wait is nil and it must
// call leave when its attempt is over (a second call does nothing).
// Otherwise wait is closed when the current leader leaves, and leave is
// nil.
func (f *Flights) Join(id int64, action string) (wait <-chan struct{}, leave func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.m[id]; ok {
		if fl.done == nil {
			fl.done = make(chan struct{})
		}
		return fl.done, nil
	}
	fl := &flight{action: action}
	f.m[id] = fl
	return nil, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if fl.left {
			return
		}
		fl.left = true
		delete(f.m, id)
		if fl.done != nil {
			close(fl.done)
		}
	}
}

// Executing reports whether a request of this process is executing id, and
// for which action.
func (f *Flights) Executing(id int64) (action string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := f.m[id]
	if !ok {
		return "", false
	}
	return fl.action, true
}
