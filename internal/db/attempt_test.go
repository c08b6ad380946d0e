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
