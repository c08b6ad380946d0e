package client

import (
	"context"
	"time"
)

// sleep waits d or until ctx ends and reports whether the full wait
// elapsed; a d of zero or less returns at once, false only if ctx has
// ended. (The server's internal/wait.For; the client's module cannot
// import the server's internal packages without taking the server's
// whole module along.)
func sleep(ctx context.Context, d time.Duration) bool {
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
