// Package wait holds the context-aware sleep that Quill's retry and pacing
// loops share. It imports only the standard library, so the client may use
// it.
package wait

import (
	"context"
	"math/rand/v2"
	"time"
)

// For waits d, or until ctx ends, and reports whether d passed. When d is
// not positive it returns at once, true unless ctx has ended.
func For(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Backoff is exponential backoff with full jitter: the n-th delay is drawn
// from [1ms, min(Base·2ⁿ, Max)]. The zero value of attempt starts at Base.
type Backoff struct {
	Base, Max time.Duration
	attempt   int
}

// Next returns the next delay and counts the attempt.
func (b *Backoff) Next() time.Duration {
	d := b.Base << min(b.attempt, 20)
	if d <= 0 || d > b.Max {
		d = b.Max
	}
	b.attempt++
	return time.Duration(rand.Int64N(int64(d))) + time.Millisecond
}

// Reset starts the delays over at Base.
func (b *Backoff) Reset() { b.attempt = 0 }
