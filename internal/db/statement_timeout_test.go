package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// requireQueryCanceled requires err to be PostgreSQL's 57014: the server
// ended the statement at its statement_timeout.
func requireQueryCanceled(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "a PostgreSQL error: %v", err)
	require.Equal(t, pgerrcode.QueryCanceled, pgErr.Code, "%v", err)
}

// Every transaction of a pool has db.StatementTimeout, directly (set for
// the session, so every statement has it), through PgBouncer in session
// mode (likewise) and in transaction mode (set in each transaction); a
// value the operator put in the URL or on the database wins.
func TestStatementTimeoutOnEverySession(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	direct := dbtest.Schema(t)
	ownDB := dbtest.Database(t)
	conn, err := pgx.Connect(ctx, ownDB)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+" SET statement_timeout = '7s'")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	for _, tc := range []struct {
		name, url string
		want      string
		session   string // outside a transaction
	}{
		{"direct", direct, db.StatementTimeout, db.StatementTimeout},
		{"pgbouncer in transaction mode", dbtest.PgBouncer(t, direct), db.StatementTimeout, "0"},
		{"pgbouncer in session mode", dbtest.PgBouncerWith(t, direct, dbtest.PgBouncerConfig{Mode: "session"}), db.StatementTimeout, db.StatementTimeout},
		{"the operator's in the URL", dbtest.WithParam(t, direct, "statement_timeout", "5min"), "5min", "5min"},
		{"the database's", ownDB, "7s", "7s"},
		{"the database's behind pgbouncer", dbtest.PgBouncer(t, ownDB), "7s", "7s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, err := db.Open(ctx, tc.url, 2)
			require.NoError(t, err)
			defer pool.Close()
			// Read in each kind of transaction, checked after it ended: a
			// failed require inside would leave the connection taken.
			show := func(q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}, v *string) error {
				return q.QueryRow(ctx, "SHOW statement_timeout").Scan(v)
			}
			var inTx, inSnapshot, inPipeline, outside string
			require.NoError(t, db.WithTx(ctx, pool, func(tx pgx.Tx) error { return show(tx, &inTx) }))
			require.NoError(t, db.WithSnapshot(ctx, pool, func(tx pgx.Tx) error { return show(tx, &inSnapshot) }))
			p, err := db.BeginPipeline(ctx, pool)
			require.NoError(t, err)
			err = show(p, &inPipeline)
			p.Rollback(ctx)
			p.Release()
			require.NoError(t, err)
			require.NoError(t, show(pool, &outside))
			require.Equal(t, tc.want, inTx, "WithTx")
			require.Equal(t, tc.want, inSnapshot, "WithSnapshot")
			require.Equal(t, tc.want, inPipeline, "Pipeline")
			// Behind a pooler a statement outside a transaction has the
			// role's setting: the runtime role of docs/operations.md sets
			// it (TestRuntimeRole).
			require.Equal(t, tc.session, outside, "outside a transaction")
		})
	}
}

// A statement that runs past db.StatementTimeout is ended by the server
// with 57014, directly and through PgBouncer; the pool stays usable.
func TestStatementTimeoutEndsALongStatement(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 30 s statement_timeout")
	}
	t.Parallel()
	ctx := t.Context()
	direct := dbtest.Schema(t)
	d, err := time.ParseDuration(db.StatementTimeout)
	require.NoError(t, err)
	sleep := "SELECT pg_sleep($1)"
	longer := (d + 20*time.Second).Seconds()
	for _, tc := range []struct{ name, url string }{
		{"direct", direct},
		{"pgbouncer", dbtest.PgBouncer(t, direct)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, err := db.Open(ctx, tc.url, 2)
			require.NoError(t, err)
			defer pool.Close()
			began := time.Now()
			err = db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, sleep, longer)
				return err
			})
			requireQueryCanceled(t, err)
			took := time.Since(began)
			require.GreaterOrEqual(t, took, d)
			require.Less(t, took, d+15*time.Second, "ended at the timeout, not by the sleep's end")
			var one int
			require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one))
		})
	}
}

// A migration is not cut short by a statement_timeout of the database (or
// role): Migrate's session has none.
func TestMigrateHasNoStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := dbtest.Database(t)
	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+" SET statement_timeout = '1ms'")
	require.NoError(t, err)
	_, err = dbtest.Migrate(ctx, u)
	require.NoError(t, err)
}
