package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/outbox"
)

// gatedExec passes a Notifier's statements to a pool, each only once the
// gate is open, and says when one arrives at the gate.
type gatedExec struct {
	pool    *pgxpool.Pool
	calls   atomic.Int32
	arrived chan struct{}
	open    chan struct{}
}

func (g *gatedExec) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	g.calls.Add(1)
	select {
	case g.arrived <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
	case <-ctx.Done():
		return pgconn.CommandTag{}, ctx.Err()
	}
	return g.pool.Exec(ctx, sql, args...)
}

// TestNotifierCoalescesSignals: a burst of signals from many writers while a
// NOTIFY is being sent costs exactly one more NOTIFY, sent after the last of
// them — none is lost, none is repeated — and a signal to an idle notifier
// sends one at once. The notifications are counted on a LISTEN session in a
// database of the test's own.
func TestNotifierCoalescesSignals(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := dbtest.Database(t)
	pool, err := db.Open(ctx, dbURL, 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	listener, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)

	// next waits for the next notification, at most d; nil if none came.
	next := func(d time.Duration) *pgconn.Notification {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return nil
		}
		return n
	}

	gate := &gatedExec{pool: pool, arrived: make(chan struct{}, 100), open: make(chan struct{})}
	var failures atomic.Int32
	n := outbox.NewNotifier(gate, func(error) { failures.Add(1) })
	nctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(nctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})

	// The first signal's NOTIFY is under way (held at the gate)...
	n.Signal()
	select {
	case <-gate.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the first signal sent no NOTIFY")
	}
	// ...when 8 writers signal 1,000 commits.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 125 {
				n.Signal()
			}
		})
	}
	wg.Wait()
	close(gate.open)

	const wait = 15 * time.Second
	require.NotNil(t, next(wait), "the NOTIFY under way")
	require.NotNil(t, next(wait), "one NOTIFY for the burst, sent after its last signal")
	require.Nil(t, next(500*time.Millisecond), "no further NOTIFY: the burst is coalesced")
	require.EqualValues(t, 2, gate.calls.Load())

	// Idle again: one signal, one NOTIFY, at once.
	n.Signal()
	require.NotNil(t, next(wait), "a signal to an idle notifier")
	require.Nil(t, next(500*time.Millisecond))
	require.EqualValues(t, 3, gate.calls.Load())
	require.Zero(t, failures.Load())
}

type failingExec struct{}

func (failingExec) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errors.New("connection refused")
}

// A failed NOTIFY goes to the error callback and does not stop the
// notifier; a nil notifier (a service without one) ignores signals.
func TestNotifierReportsFailuresAndKeepsGoing(t *testing.T) {
	t.Parallel()
	errs := make(chan error, 10)
	n := outbox.NewNotifier(failingExec{}, func(err error) { errs <- err })
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	for i := range 2 {
		n.Signal()
		select {
		case err := <-errs:
			require.ErrorContains(t, err, "notify relays")
			require.ErrorContains(t, err, "connection refused")
		case <-time.After(30 * time.Second):
			t.Fatalf("failure %d not reported", i+1)
		}
	}
	stop()
	require.NoError(t, <-done)

	var none *outbox.Notifier
	none.Signal()
}
