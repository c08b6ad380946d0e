package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/retention"
)

// TestRuntimeRole runs roles.sql, migrates as the owner, and then, as the
// runtime role, directly and through PgBouncer: writes a note as the API
// does, issues and checks a token, reads the outbox's backlog and runs a
// retention pass — and is refused (42501) every change of the schema.
func TestRuntimeRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r := dbtest.Roles(t)
	_, err := dbtest.Migrate(ctx, r.Owner)
	require.NoError(t, err, "api migrate as the owner")
	_, err = dbtest.Migrate(ctx, r.Owner)
	require.NoError(t, err, "and again, with nothing to do")

	for _, tc := range []struct{ name, url string }{
		{"direct", r.Runtime},
		{"pgbouncer", dbtest.PgBouncer(t, r.Runtime)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, err := db.Open(ctx, tc.url, 4)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			works(t, pool)
			var timeout string
			require.NoError(t, pool.QueryRow(ctx, "SHOW statement_timeout").Scan(&timeout))
			require.Equal(t, db.StatementTimeout, timeout, "the role's setting, outside a transaction too")
		})
	}

	pool, err := db.Open(ctx, r.Runtime, 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, sql := range []string{
		"DROP TABLE notes",
		"TRUNCATE notes",
		"ALTER TABLE notes ADD COLUMN x int",
		"ALTER TABLE operations DISABLE TRIGGER USER",
		"CREATE INDEX ON notes (title)",
		"CREATE TABLE x (id int)",
		"CREATE TABLE public.x (id int)",
		"DROP SCHEMA " + r.Schema + " CASCADE",
		"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
	} {
		_, err := pool.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", sql, err)
		require.Equal(t, pgerrcode.InsufficientPrivilege, pgErr.Code, "%s: %v", sql, err)
	}
}

// works does as the programs do on pool: a note written, a token issued
// and checked, the backlog read, a retention pass.
func works(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := t.Context()
	svc, err := notes.NewService(pool, notes.Config{}, zerolog.Nop())
	require.NoError(t, err)
	res, err := svc.Create(ctx, notes.Request{Tenant: "acme", Key: "key-" + t.Name(), Wait: -1, Render: httpapi.RenderWrite},
		notes.CreateParams{Title: "written by the runtime role"})
	require.NoError(t, err)
	require.Equal(t, notes.OutcomeCreated, res.Outcome)
	tok, err := auth.Create(ctx, pool, "acme", time.Now())
	require.NoError(t, err)
	tenant, err := auth.Authenticate(ctx, pool, "Bearer "+tok)
	require.NoError(t, err)
	require.Equal(t, "acme", tenant)
	require.NoError(t, auth.Revoke(ctx, pool, tok, time.Now()))
	b, err := outbox.Backlog(ctx, pool)
	require.NoError(t, err)
	require.NotZero(t, b.Pending)
	c, err := retention.New(pool, retention.Config{}, zerolog.Nop())
	require.NoError(t, err)
	require.NoError(t, c.Clean(ctx))
}
