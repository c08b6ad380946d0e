package notes_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/testkit"
)

func replays(t *testing.T, pool *pgxpool.Pool, tenant, key string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT replays FROM operations WHERE tenant = $1 AND key = $2`, tenant, key).Scan(&n))
	return n
}

// Replays are counted in memory, from the cache and from the database alike,
// and a flush adds them to the operation's record; executions and refusals
// are not replays.
func TestReplayCounterFlushes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cache int
	}{{"cached", 0}, {"uncached", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool, _ := dbtest.Pool(t, 4)
			svc, err := notes.NewService(pool, notes.Config{ReplayCacheBytes: tc.cache}, zerolog.New(io.Discard))
			require.NoError(t, err)
			tenant := reviewTenant()
			req := notes.Request{Tenant: tenant, Key: "k1", Wait: -1, Render: httpapi.RenderWrite}
			out, err := svc.Create(ctx, req, notes.CreateParams{Title: "once"})
			require.NoError(t, err)
			require.False(t, out.Replayed)
			for range 3 {
				out, err := svc.Create(ctx, req, notes.CreateParams{Title: "once"})
				require.NoError(t, err)
				require.True(t, out.Replayed)
			}
			_, err = svc.Create(ctx, req, notes.CreateParams{Title: "changed"})
			require.Error(t, err, "a reused key is refused, not replayed")
			require.Equal(t, 0, replays(t, pool, tenant, "k1"), "nothing is written on the replay path")

			n, err := svc.FlushReplays(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 3, n)
			require.Equal(t, 3, replays(t, pool, tenant, "k1"))

			_, err = svc.Create(ctx, req, notes.CreateParams{Title: "once"})
			require.NoError(t, err)
			n, err = svc.FlushReplays(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, n, "a flush writes only what came since the last one")
			require.Equal(t, 4, replays(t, pool, tenant, "k1"))
			n, err = svc.FlushReplays(ctx)
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
}

// A flush that fails keeps its counts for the next one.
func TestReplayCounterKeepsCountsWhenFlushFails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.Pool(t, 4)
	svc, err := notes.NewService(pool, notes.Config{}, zerolog.New(io.Discard))
	require.NoError(t, err)
	tenant := reviewTenant()
	req := notes.Request{Tenant: tenant, Key: "k1", Wait: -1, Render: httpapi.RenderWrite}
	for range 3 {
		_, err := svc.Create(ctx, req, notes.CreateParams{Title: "x"})
		require.NoError(t, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = svc.FlushReplays(cancelled)
	require.Error(t, err)
	n, err := svc.FlushReplays(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, 2, replays(t, pool, tenant, "k1"))
}

// RunReplayCounter flushes on its ticker and once more when stopped, so
// replays answered just before shutdown are not lost.
func TestRunReplayCounterFlushesPeriodicallyAndOnStop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := dbtest.Pool(t, 4)
	svc, err := notes.NewService(pool, notes.Config{ReplayFlushInterval: 20 * time.Millisecond}, zerolog.New(io.Discard))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.RunReplayCounter(runCtx) }()
	tenant := reviewTenant()
	req := notes.Request{Tenant: tenant, Key: "k1", Wait: -1, Render: httpapi.RenderWrite}
	for range 2 {
		_, err := svc.Create(ctx, req, notes.CreateParams{Title: "x"})
		require.NoError(t, err)
	}
	testkit.WaitFor(t, 10*time.Second, func() bool { return replays(t, pool, tenant, "k1") == 1 }, "the ticker flushes")

	// Stopped right after a replay: the final flush writes it.
	slow, err := notes.NewService(pool, notes.Config{ReplayFlushInterval: time.Hour}, zerolog.New(io.Discard))
	require.NoError(t, err)
	slowCtx, stopSlow := context.WithCancel(context.Background())
	slowDone := make(chan error, 1)
	go func() { slowDone <- slow.RunReplayCounter(slowCtx) }()
	_, err = slow.Create(ctx, req, notes.CreateParams{Title: "x"})
	require.NoError(t, err)
	stopSlow()
	require.NoError(t, <-slowDone)
	require.Equal(t, 2, replays(t, pool, tenant, "k1"))

	stop()
	require.NoError(t, <-done)
}
