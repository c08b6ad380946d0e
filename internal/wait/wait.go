// Package wait holds the context-aware sleep that Quill's retry and pacing
// loops share. It imports only the standard library, so the client may use
// it.
package wait

import (
	"context"
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
