package db_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// The lost-commit recheck bounds the session's start with the database's
// clock, read when the session began, never the API host's: a host clock
// behind PostgreSQL's would make the old session look younger than the
// bound and survive the recheck; one ahead would let a later session with
// the reused pid be ended. The bound lies between the session's
// backend_start and anything the session did afterwards.
func TestPipelineSessionStartIsTheDatabaseClock(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 1)
	ctx := t.Context()
	var backendStart, later time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT backend_start, clock_timestamp() FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&backendStart, &later))
	// Time passes on the session: a bound read now, by either clock,
	// would be after later.
	time.Sleep(50 * time.Millisecond)

	p, err := db.BeginPipeline(ctx, pool)
	require.NoError(t, err)
	defer p.Release()
	defer p.Rollback(ctx)
	since := db.SessionStartOf(p)
	require.False(t, since.Before(backendStart), "at or after the session's start (%s, backend_start %s)", since, backendStart)
	require.True(t, since.Before(later), "read when the session began, on the database's clock (%s), not at the pipeline's begin", since)
}
