package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

type key struct{}

// An attempt's context ends at the acquire's bound while no connection was
// handed out, at the attempt's bound once one was, or when cancelled; it
// keeps the caller's values and none of its cancellation; context.AfterFunc
// and children follow it.
func TestAttemptContext(t *testing.T) {
	t.Parallel()
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))

	t.Run("the acquire's bound", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := db.NewAttemptContext(parent, 20*time.Millisecond, time.Hour)
		defer cancel()
		after := make(chan struct{})
		context.AfterFunc(ctx, func() { close(after) })
		child, cancelChild := context.WithCancel(ctx)
		defer cancelChild()
		<-ctx.Done()
		<-after
		<-child.Done()
		require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
		require.ErrorIs(t, child.Err(), context.DeadlineExceeded, "a child ends as its parent did")
		require.False(t, ctx.Acquired(), "too late")
		_, has := ctx.Deadline()
		require.False(t, has)
	})
	t.Run("acquired: the attempt's bound", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := db.NewAttemptContext(parent, 20*time.Millisecond, 300*time.Millisecond)
		defer cancel()
		require.True(t, ctx.Acquired())
		select {
		case <-ctx.Done():
			t.Fatal("ended at the acquire's bound after the connection came")
		case <-time.After(150 * time.Millisecond):
		}
		require.NoError(t, ctx.Err())
		<-ctx.Done()
		require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	})
	t.Run("cancelled, values, the caller's cancellation", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := db.NewAttemptContext(parent, time.Hour, time.Hour)
		require.Equal(t, "v", ctx.Value(key{}))
		ran := make(chan struct{}, 1)
		stop := context.AfterFunc(ctx, func() { ran <- struct{}{} })
		require.True(t, stop(), "stopped before it ran")
		context.AfterFunc(ctx, func() { ran <- struct{}{} })
		cancelParent()
		require.NoError(t, ctx.Err(), "the caller's cancellation does not reach the attempt")
		cancel()
		<-ctx.Done()
		<-ran
		require.ErrorIs(t, ctx.Err(), context.Canceled)
		require.Len(t, ran, 0, "the stopped function did not run")
	})
}

// Behind a full pool, BeginPipeline in an attempt's context answers
// ErrPoolTimeout at the acquire's bound; with a free connection the
// attempt goes on past it.
func TestAttemptContextAcquire(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 1)
	held, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	ctx, cancel := db.NewAttemptContext(t.Context(), 50*time.Millisecond, time.Minute)
	_, err = db.BeginPipeline(ctx, pool)
	cancel()
	require.ErrorIs(t, err, db.ErrPoolTimeout)
	held.Release()

	ctx, cancel = db.NewAttemptContext(t.Context(), 50*time.Millisecond, time.Minute)
	defer cancel()
	p, err := db.BeginPipeline(ctx, pool)
	require.NoError(t, err)
	defer p.Release()
	time.Sleep(100 * time.Millisecond)
	var one int
	p.Batch().Queue(`SELECT 1`).QueryRow(func(r pgx.Row) error { return r.Scan(&one) })
	require.NoError(t, p.Commit(ctx))
	require.Equal(t, 1, one)
	require.False(t, errors.Is(ctx.Err(), context.DeadlineExceeded))
}

// pgx is handed an attempt's values without its end (it watches nothing),
// so the attempt's end must reach the connection itself: a statement still
// running when the attempt's bound passes ends then, its commit's outcome
// unknown, and the pool's next caller gets a working connection.
func TestPipelineEndsWithItsAttempt(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 1)
	ctx, cancel := db.NewAttemptContext(t.Context(), time.Minute, 300*time.Millisecond)
	defer cancel()
	p, err := db.BeginPipeline(ctx, pool)
	require.NoError(t, err)
	p.Batch().Queue(`SELECT pg_sleep(3)`)
	start := time.Now()
	err = p.Commit(ctx)
	p.Release()
	var lost *db.OutcomeUnknownError
	require.ErrorAs(t, err, &lost, "a commit trip cut short by the attempt's end")
	require.Less(t, time.Since(start), 2*time.Second, "the statement outlived the attempt")

	var one int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT 1`).Scan(&one))
	require.Equal(t, 1, one)
}

// An attempt that ends after its transaction committed, before Release,
// leaves a past deadline on an idle connection: Release closes it rather
// than handing it to the pool's next caller, whose statements would fail
// at once.
func TestPipelineAfterItsAttemptEndedIsNotPooled(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 1)
	ctx, cancel := db.NewAttemptContext(t.Context(), time.Minute, 200*time.Millisecond)
	defer cancel()
	p, err := db.BeginPipeline(ctx, pool)
	require.NoError(t, err)
	var first uint32
	p.Batch().Queue(`SELECT pg_backend_pid()`).QueryRow(func(r pgx.Row) error { return r.Scan(&first) })
	require.NoError(t, p.Commit(ctx))
	require.Eventually(t, func() bool { return ctx.Err() != nil }, 5*time.Second, 10*time.Millisecond)
	p.Release()

	var next uint32
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&next), "the pool handed out the connection the attempt's end had cut")
	require.NotEqual(t, first, next)
}

// Attempts of one Attempts end each at its own bound by their one timer:
// one not handed a connection at its acquire's bound — also one started
// while the timer waits for a later end — one handed it at its own end and
// not at the acquire's, one cancelled at once, whichever order they started
// and were acquired in, and none before its bound.
func TestAttemptsEndEachAtItsBound(t *testing.T) {
	t.Parallel()
	const acquire, total = 60 * time.Millisecond, 1500 * time.Millisecond
	a := db.NewAttempts(acquire, total)
	type attempt struct {
		ctx      *db.AttemptContext
		started  time.Time
		acquired bool
		ended    chan time.Time
	}
	start := func(acquired bool) *attempt {
		ctx, cancel := a.Start(t.Context())
		t.Cleanup(cancel)
		at := &attempt{ctx: ctx, started: time.Now(), acquired: acquired, ended: make(chan time.Time, 1)}
		context.AfterFunc(ctx, func() { at.ended <- time.Now() })
		if acquired {
			require.True(t, ctx.Acquired())
		}
		return at
	}
	// The first is acquired: the timer waits for its end, 1.5 s away,
	// once its acquire's bound passed. Those started after must not wait
	// for it.
	first := start(true)
	time.Sleep(2 * acquire)
	attempts := []*attempt{first}
	for i := range 6 {
		attempts = append(attempts, start(i%2 == 0))
		time.Sleep(acquire / 4)
	}
	cancelled, cancel := a.Start(t.Context())
	cancel()
	<-cancelled.Done()
	require.ErrorIs(t, cancelled.Err(), context.Canceled)

	ended := make([]time.Time, len(attempts))
	for i, at := range attempts {
		ended[i] = <-at.ended
		require.ErrorIs(t, at.ctx.Err(), context.DeadlineExceeded)
	}
	for i, at := range attempts {
		bound := acquire
		if at.acquired {
			bound = total
		}
		require.GreaterOrEqual(t, ended[i].Sub(at.started), bound, "attempt %d ended before its bound", i)
		if !at.acquired {
			require.True(t, ended[i].Before(ended[0]), "attempt %d, not acquired, waited for the first's end", i)
			require.False(t, at.ctx.Acquired(), "attempt %d acquired after its end", i)
		}
	}
	// After its end the Attempts' timer serves new attempts again.
	again := start(false)
	<-again.ctx.Done()
	require.GreaterOrEqual(t, time.Since(again.started), acquire)
}
