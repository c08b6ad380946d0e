package db

import (
	"context"
	"net"
	"sync"
	"time"
)

// AttemptContext is the context of one write attempt with one timer: it
// is detached from the caller's cancellation (it keeps the caller's
// values), is done first when the wait for a pool connection has lasted
// AcquireTimeout and, once Acquire has handed out a connection, when the
// whole attempt has lasted its timeout instead. A write had a context
// with a deadline for the attempt and another for the acquire; the timer
// each made woke the scheduler's poller, 5 % of a create's CPU (issue 29).
//
// It reports no Deadline: the deadline moves once, which a Context's
// Deadline must not. Err is context.DeadlineExceeded when a timeout ended
// it, context.Canceled when its CancelFunc did.
type AttemptContext struct {
	values context.Context
	start  time.Time
	total  time.Duration
	timer  *time.Timer

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

// NewAttemptContext returns an attempt's context, which keeps parent's
// values and none of its cancellation, and its CancelFunc, which the
// caller must call when the attempt is over — after releasing a Pipeline
// begun in it: the end of the context cuts the connection of a Pipeline
// not yet released, which Release then closes.
func NewAttemptContext(parent context.Context, acquireTimeout, timeout time.Duration) (*AttemptContext, context.CancelFunc) {
	// parent is kept for its values only: Done, Err and AfterFunc are
	// this context's own, and the context package, which finds a
	// cancelable parent by its Done channel, never takes parent's for
	// this one's.
	c := &AttemptContext{values: parent, start: time.Now(), total: timeout}
	c.timer = time.AfterFunc(min(acquireTimeout, timeout), func() { c.end(context.DeadlineExceeded) })
	return c, func() {
		c.timer.Stop()
		c.end(context.Canceled)
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

// Acquired moves the timer from the acquire's bound to the attempt's: what
// is left of its timeout. It reports false when the context had ended.
func (c *AttemptContext) Acquired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	if !c.acquired {
		c.acquired = true
		c.timer.Reset(c.total - time.Since(c.start))
	}
	return true
}

// acquireExpired reports whether the acquire's bound ended the context.
func (c *AttemptContext) acquireExpired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.acquired && c.err == context.DeadlineExceeded
}

// end ends the context with err, once.
func (c *AttemptContext) end(err error) {
	c.mu.Lock()
	if c.err != nil {
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
