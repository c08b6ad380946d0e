package db

import (
	"context"
	"net"
	"sync"
	"time"
)

// AttemptContext is the context of one write attempt: it is detached
// from the caller's cancellation (it keeps the caller's values), is done
// first when the wait for a pool connection has lasted its acquire
// timeout and, once Acquire has handed out a connection, when the whole
// attempt has lasted its timeout instead. A write had a context with a
// deadline for the attempt and another for the acquire; the timer each
// made woke the scheduler's poller, 5 % of a create's CPU (issue 29), and
// the one timer of an attempt still cost 2 allocations and 2.5 µs of it:
// the Attempts that start attempts of the same timeouts keep one timer for
// all of them.
//
// It reports no Deadline: the deadline moves once, which a Context's
// Deadline must not. Err is context.DeadlineExceeded when a timeout ended
// it, context.Canceled when its CancelFunc did.
type AttemptContext struct {
	values context.Context
	of     *Attempts
	// acquireBy and deadline are when its acquire's bound and its own
	// end; links are its places in the Attempts' queues of each.
	acquireBy, deadline time.Time
	links               [2]link

	mu       sync.Mutex
	done     chan struct{} // made on the first Done
	err      error
	acquired bool
	// afters are the functions AfterFunc registered, in order; a stopped
	// one is nil.
	afters []func()
	// watched is the connection whose deadline the end sets (watch), and
	// fired says that it did.
	watched net.Conn
	fired   bool
}

// Attempts begins the attempts of one acquire timeout and one timeout and
// ends each when its bound passes, by one timer for all of them. An
// attempt's bounds are its start plus a constant, and attempts are queued
// in the order they start, so each queue — of acquire bounds, of attempts'
// ends — is in the order of its bounds: the timer is set for the earliest
// head, and is set anew only when a new attempt's acquire bound comes
// before it, or when it fired. Under load it fires about once per acquire
// timeout, not once per attempt. An Attempts is safe for concurrent use
// and needs no closing.
type Attempts struct {
	acquire, total time.Duration

	mu     sync.Mutex
	queues [2]queue // of acquire bounds (acquiring), of ends (all)
	timer  *time.Timer
	armed  bool
	at     time.Time // when the timer fires, while armed
}

// The Attempts' queues.
const (
	acquiring = iota // attempts not handed a connection yet, by acquireBy
	all              // every attempt not over, by deadline
)

// link is an attempt's place in one of the Attempts' queues.
type link struct {
	prev, next *AttemptContext
	in         bool
}

// queue is a list of attempts linked through their links[i].
type queue struct{ head, tail *AttemptContext }

func (q *queue) push(c *AttemptContext, i int) {
	c.links[i] = link{prev: q.tail, in: true}
	if q.tail != nil {
		q.tail.links[i].next = c
	} else {
		q.head = c
	}
	q.tail = c
}

func (q *queue) remove(c *AttemptContext, i int) {
	l := &c.links[i]
	if !l.in {
		return
	}
	if l.prev != nil {
		l.prev.links[i].next = l.next
	} else {
		q.head = l.next
	}
	if l.next != nil {
		l.next.links[i].prev = l.prev
	} else {
		q.tail = l.prev
	}
	*l = link{}
}

// NewAttempts returns an Attempts whose attempts wait at most
// acquireTimeout for a pool connection and last at most timeout.
func NewAttempts(acquireTimeout, timeout time.Duration) *Attempts {
	return &Attempts{acquire: min(acquireTimeout, timeout), total: timeout}
}

// NewAttemptContext returns an attempt of an Attempts of its own (see
// Attempts.Start): one timer for the one attempt.
func NewAttemptContext(parent context.Context, acquireTimeout, timeout time.Duration) (*AttemptContext, context.CancelFunc) {
	return NewAttempts(acquireTimeout, timeout).Start(parent)
}

// Start returns an attempt's context, which keeps parent's values and none
// of its cancellation, and its CancelFunc, which the caller must call when
// the attempt is over — after releasing a Pipeline begun in it: the end of
// the context cuts the connection of a Pipeline not yet released, which
// Release then closes.
func (a *Attempts) Start(parent context.Context) (*AttemptContext, context.CancelFunc) {
	// parent is kept for its values only: Done, Err and AfterFunc are
	// this context's own, and the context package, which finds a
	// cancelable parent by its Done channel, never takes parent's for
	// this one's.
	c := &AttemptContext{values: parent, of: a}
	a.mu.Lock()
	// Read under a.mu, so that the queues are in the order of bounds.
	now := time.Now()
	c.acquireBy, c.deadline = now.Add(a.acquire), now.Add(a.total)
	a.queues[acquiring].push(c, acquiring)
	a.queues[all].push(c, all)
	a.armBy(c.acquireBy)
	a.mu.Unlock()
	return c, func() {
		a.mu.Lock()
		a.queues[acquiring].remove(c, acquiring)
		a.queues[all].remove(c, all)
		a.mu.Unlock()
		c.end(context.Canceled, false)
	}
}

// armBy makes the timer fire at t at the latest. Callers hold a.mu.
func (a *Attempts) armBy(t time.Time) {
	if a.armed && !t.Before(a.at) {
		return
	}
	a.armed, a.at = true, t
	if a.timer == nil {
		a.timer = time.AfterFunc(time.Until(t), a.fire)
		return
	}
	a.timer.Reset(time.Until(t))
}

// fire ends the attempts whose bound passed and sets the timer for the
// next one.
func (a *Attempts) fire() {
	var acquireEnded, ended []*AttemptContext
	a.mu.Lock()
	a.armed = false
	now := time.Now()
	for c := a.queues[acquiring].head; c != nil && !now.Before(c.acquireBy); c = a.queues[acquiring].head {
		a.queues[acquiring].remove(c, acquiring)
		acquireEnded = append(acquireEnded, c)
	}
	for c := a.queues[all].head; c != nil && !now.Before(c.deadline); c = a.queues[all].head {
		a.queues[all].remove(c, all)
		a.queues[acquiring].remove(c, acquiring)
		ended = append(ended, c)
	}
	if c := a.queues[acquiring].head; c != nil {
		a.armBy(c.acquireBy)
	}
	if c := a.queues[all].head; c != nil {
		a.armBy(c.deadline)
	}
	a.mu.Unlock()
	// Outside a.mu: an attempt's own lock is taken before its Attempts'.
	for _, c := range acquireEnded {
		c.end(context.DeadlineExceeded, true)
	}
	for _, c := range ended {
		c.end(context.DeadlineExceeded, false)
	}
}

// Deadline reports none; see AttemptContext.
func (c *AttemptContext) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done returns a channel closed when the context ends.
func (c *AttemptContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

// Err returns nil until the context ends, then why.
func (c *AttemptContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value returns the value of the caller's context for key.
func (c *AttemptContext) Value(key any) any { return c.values.Value(key) }

// AfterFunc arranges for f to run in a goroutine of its own once the
// context ends, as context.AfterFunc does; context.AfterFunc and the
// context package's children use it, so that none of them needs a
// goroutine watching Done.
func (c *AttemptContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	if c.afters == nil {
		c.afters = make([]func(), 0, 4)
	}
	i := len(c.afters)
	c.afters = append(c.afters, f)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.err != nil || c.afters[i] == nil {
			return false
		}
		c.afters[i] = nil
		return true
	}
}

// Acquired moves the attempt from the acquire's bound to its own: its
// start plus its timeout. It reports false when the context had ended.
func (c *AttemptContext) Acquired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	if !c.acquired {
		c.acquired = true
		c.of.mu.Lock()
		c.of.queues[acquiring].remove(c, acquiring)
		c.of.mu.Unlock()
	}
	return true
}

// acquireExpired reports whether the acquire's bound ended the context.
func (c *AttemptContext) acquireExpired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.acquired && c.err == context.DeadlineExceeded
}

// end ends the context with err, once — unless acquireBound says that the
// acquire's bound passed and the attempt was handed its connection by then.
func (c *AttemptContext) end(err error, acquireBound bool) {
	c.mu.Lock()
	if c.err != nil || acquireBound && c.acquired {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.watched != nil {
		// Under c.mu, so that unwatch knows whether it happened.
		_ = c.watched.SetDeadline(pastDeadline)
		c.watched, c.fired = nil, true
	}
	afters := c.afters
	c.afters = nil
	c.mu.Unlock()
	for _, f := range afters {
		if f != nil {
			go f()
		}
	}
}

// pastDeadline is a deadline long gone: set on a connection, it ends the
// read or write in progress on it at once, and any later one.
var pastDeadline = time.Unix(1, 0)

// watch makes the end of c set a past deadline on nc, which ends the read
// or write in progress there — what pgx does when the context it was
// handed ends (pgconn's DeadlineContextWatcherHandler) — so that pgx can
// be handed c's values without its end (detached) and watch nothing: its
// watch of a context with a Done channel cost a channel and an
// after-function per round trip, 6 allocations of a create (issue 29).
// It reports false, and arranges nothing, when c has ended already.
func (c *AttemptContext) watch(nc net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.watched = nc
	return true
}

// unwatch ends watch. It reports whether c's end set the deadline, in which
// case the connection must be closed, not pooled.
func (c *AttemptContext) unwatch() (fired bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watched = nil
	return c.fired
}

// detached returns c as a context with c's values and no end: what pgx is
// handed for a connection that watch covers.
func (c *AttemptContext) detached() context.Context { return attemptValues{c} }

// attemptValues is an AttemptContext seen without its end (detached).
type attemptValues struct{ c *AttemptContext }

func (attemptValues) Deadline() (time.Time, bool) { return time.Time{}, false }
func (attemptValues) Done() <-chan struct{}       { return nil }
func (attemptValues) Err() error                  { return nil }
func (v attemptValues) Value(key any) any         { return v.c.values.Value(key) }
