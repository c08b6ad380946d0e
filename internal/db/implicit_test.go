package db_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// sqlTracer records the SQL of every statement its pool sends.
type sqlTracer struct {
	mu  sync.Mutex
	sql []string
}

func (r *sqlTracer) add(sql string) { r.mu.Lock(); r.sql = append(r.sql, sql); r.mu.Unlock() }

func (r *sqlTracer) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.sql
	r.sql = nil
	return out
}

func (r *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(d.SQL)
	return ctx
}
func (r *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *sqlTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (r *sqlTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add(d.SQL)
}
func (r *sqlTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// traced opens url as db.Open does and returns a pool of the same
// configuration whose statements tr records.
func traced(t *testing.T, url string) (*pgxpool.Pool, *sqlTracer) {
	t.Helper()
	base, err := db.Open(t.Context(), url, 2)
	require.NoError(t, err)
	t.Cleanup(base.Close)
	cfg := base.Config().Copy()
	tr := &sqlTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, tr
}

// oneTrip runs a pipelined transaction whose statements all go with
// Commit: it creates table t if need be, inserts v and reads the
// transaction's isolation level.
func oneTrip(t *testing.T, pool *pgxpool.Pool, v int, extra string) (string, error) {
	t.Helper()
	p, err := db.BeginPipeline(t.Context(), pool)
	require.NoError(t, err)
	defer p.Release()
	var iso string
	p.Batch().Queue(`INSERT INTO implicit_t VALUES ($1)`, v)
	p.Batch().Queue(`SELECT current_setting('transaction_isolation')`).QueryRow(func(r pgx.Row) error { return r.Scan(&iso) })
	if extra != "" {
		p.Batch().Queue(extra)
	}
	return iso, p.Commit(t.Context())
}

func hasBeginOrCommit(sql []string) bool {
	return slices.ContainsFunc(sql, func(s string) bool { return s == "COMMIT" || len(s) >= 5 && s[:5] == "BEGIN" })
}

// A transaction sent whole in Commit's round trip on a direct session goes
// without BEGIN and COMMIT, at READ COMMITTED even where the database's
// default is SERIALIZABLE; a failing statement rolls back the whole of it
// and leaves the session usable; a transaction of more than one round
// trip, or on a session whose URL names another default isolation, keeps
// BEGIN and COMMIT.
func TestOneTripTransactionIsImplicit(t *testing.T) {
	t.Parallel()
	url := dbtest.Database(t)
	admin, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer admin.Close(context.Background())
	_, err = admin.Exec(t.Context(), `CREATE TABLE implicit_t (v int PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = admin.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{admin.Config().Database}.Sanitize()+` SET default_transaction_isolation = 'serializable'`)
	require.NoError(t, err)
	count := func(v int) int {
		var n int
		require.NoError(t, admin.QueryRow(t.Context(), `SELECT count(*) FROM implicit_t WHERE v = $1`, v).Scan(&n))
		return n
	}

	pool, tr := traced(t, url)
	iso, err := oneTrip(t, pool, 1, "")
	require.NoError(t, err)
	require.Equal(t, "read committed", iso)
	require.Equal(t, 1, count(1))
	sent := tr.take()
	require.False(t, hasBeginOrCommit(sent), "sent %q", sent)

	_, err = oneTrip(t, pool, 2, `SELECT 1/0`)
	require.Error(t, err)
	require.Zero(t, count(2), "the failed transaction's insert was rolled back")
	_, err = oneTrip(t, pool, 3, "")
	require.NoError(t, err, "the session is usable after a failed implicit transaction")
	require.Equal(t, 1, count(3))
	tr.take()

	// Two round trips: BEGIN names the level.
	p, err := db.BeginPipeline(t.Context(), pool)
	require.NoError(t, err)
	p.Batch().Queue(`INSERT INTO implicit_t VALUES (4)`)
	require.NoError(t, p.Send(t.Context()))
	require.NoError(t, p.Commit(t.Context()))
	p.Release()
	require.Equal(t, 1, count(4))
	require.True(t, hasBeginOrCommit(tr.take()))

	// A URL that names another default isolation keeps BEGIN and COMMIT.
	named, tr2 := traced(t, dbtest.WithParam(t, url, "default_transaction_isolation", "serializable"))
	iso, err = oneTrip(t, named, 5, "")
	require.NoError(t, err)
	require.Equal(t, "read committed", iso)
	require.True(t, hasBeginOrCommit(tr2.take()))
	require.Equal(t, 1, count(5))
}
