package db_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// A transaction sent whole in Commit's round trip goes to pgconn itself
// on a direct session in pgx's cached-statement mode (the default) and
// through pgx.Batch in every other mode; either way its rows reach their
// callbacks, and a refused statement rolls back the whole trip and comes
// back as the server's error, not as an unknown outcome.
func TestCommitSendsItselfInTheCachedStatementMode(t *testing.T) {
	t.Parallel()
	_, u := dbtest.Pool(t, 1)
	setup, err := db.Open(t.Context(), u, 1)
	require.NoError(t, err)
	defer setup.Close()
	_, err = setup.Exec(t.Context(), `CREATE TABLE direct_t (id int PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	for i, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool, err := db.Open(t.Context(), dbtest.WithParam(t, u, "default_query_exec_mode", mode), 1)
			require.NoError(t, err)
			defer pool.Close()
			id := 10 * (i + 1)

			p, err := db.BeginPipeline(t.Context(), pool)
			require.NoError(t, err)
			var got string
			p.Batch().Queue(`INSERT INTO direct_t VALUES ($1, $2)`, id, "é'\"x")
			p.Batch().Queue(`SELECT v FROM direct_t WHERE id = $1`, id).QueryRow(func(row pgx.Row) error { return row.Scan(&got) })
			require.NoError(t, p.Commit(t.Context()))
			if mode == "cache_statement" {
				require.Equal(t, 2, db.DirectStatements(p), "both statements described for the direct path")
			} else {
				require.Equal(t, -1, db.DirectStatements(p), "pgx.Batch in %s", mode)
			}
			p.Release()
			require.Equal(t, "é'\"x", got)

			// The second statement is refused: the first is rolled back
			// with it, and the error is the server's.
			p, err = db.BeginPipeline(t.Context(), pool)
			require.NoError(t, err)
			p.Batch().Queue(`INSERT INTO direct_t VALUES ($1, $2)`, id+1, "y")
			p.Batch().Queue(`INSERT INTO direct_t VALUES ($1, $2)`, id, "dup")
			err = p.Commit(t.Context())
			p.Release()
			var lost *db.OutcomeUnknownError
			require.False(t, errors.As(err, &lost), "a refusal is not an unknown outcome: %v", err)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, pgerrcode.UniqueViolation, pgErr.Code)
			var n int
			require.NoError(t, setup.QueryRow(t.Context(), `SELECT count(*) FROM direct_t WHERE id = $1`, id+1).Scan(&n))
			require.Zero(t, n, "the refused trip's first insert was rolled back")
		})
	}
}

// When a statement's result columns change under a connection's kept
// description, the commit fails as pgx's own cache fails it once, the
// connection is closed at Release, and the next transaction describes the
// statement afresh.
func TestCommitAfterAResultTypeChanged(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 1)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `CREATE TABLE direct_stale (a int); INSERT INTO direct_stale VALUES (1)`)
	require.NoError(t, err)
	commit := func(dest ...any) error {
		p, err := db.BeginPipeline(ctx, pool)
		require.NoError(t, err)
		defer p.Release()
		require.NotEqual(t, -1, db.DirectStatements(p))
		p.Batch().Queue(`SELECT * FROM direct_stale`).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
		return p.Commit(ctx)
	}
	var a, b int
	require.NoError(t, commit(&a))
	_, err = pool.Exec(ctx, `ALTER TABLE direct_stale ADD COLUMN b int DEFAULT 2`)
	require.NoError(t, err)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, commit(&a, &b), &pgErr)
	require.Equal(t, pgerrcode.FeatureNotSupported, pgErr.Code)
	require.NoError(t, commit(&a, &b))
	require.Equal(t, []int{1, 2}, []int{a, b})
}

// A connection prepares at most MaxDirectStatements statements for itself;
// a transaction with one more, or with pgx's argument options (named
// arguments here), goes through pgx.Batch, and all of them commit.
func TestCommitSendsThroughPgxPastItsStatements(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 1)
	ctx := t.Context()
	commit := func(sql string, args ...any) (int, int) {
		t.Helper()
		p, err := db.BeginPipeline(ctx, pool)
		require.NoError(t, err)
		defer p.Release()
		var got int
		p.Batch().Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&got) })
		require.NoError(t, p.Commit(ctx), sql)
		return got, db.DirectStatements(p)
	}
	for i := range db.MaxDirectStatements + 10 {
		got, described := commit(fmt.Sprintf(`SELECT $1::int + %d`, i), 1)
		require.Equal(t, 1+i, got)
		require.Equal(t, min(i+1, db.MaxDirectStatements), described)
	}
	got, described := commit(`SELECT 7 + @n::int`, pgx.NamedArgs{"n": 1})
	require.Equal(t, 8, got)
	require.Equal(t, db.MaxDirectStatements, described, "named arguments went through pgx.Batch")
}
