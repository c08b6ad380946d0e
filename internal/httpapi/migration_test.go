package httpapi_test

import (
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/migrations"
)

// Migration 00015 turns each record's HTTP status and Location into its
// outcome and back: records taken down to 00014 carry exactly what the API
// recorded before (201 and the resource as Location for a create, 200 for a
// delete, 404 for one that found nothing), and once up again each replays
// byte for byte — status, Location, body. A status that names no outcome
// stops the migration.
func TestOperationOutcomeMigrationKeepsReplays(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := dbtest.EmptySchema(t)
	cfg, err := pgx.ParseConfig(u)
	require.NoError(t, err)
	sqlDB := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = sqlDB.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS)
	require.NoError(t, err)
	pool, err := db.Open(ctx, u, 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// As db.Migrate: the consumer package's tables first (00014 moves
	// rows into them).
	require.NoError(t, consumer.Migrate(ctx, pool))
	// The current code runs on the current schema (00016's columns).
	_, err = provider.UpTo(ctx, 16)
	require.NoError(t, err)
	svc, err := notes.NewService(pool, notes.Config{ReplayCacheBytes: -1}, zerolog.Nop())
	require.NoError(t, err)
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Deps{Pool: pool, Notes: svc, Log: zerolog.Nop()}))
	t.Cleanup(srv.Close)
	tok, err := auth.Create(ctx, pool, "acme", time.Now())
	require.NoError(t, err)
	send := func(method, path, key, body string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Idempotency-Key", key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, res.Header, string(b)
	}
	type answer struct {
		status   int
		location string
		ctype    string
		body     string
	}
	writes := map[string]func() answer{}
	first := map[string]answer{}
	do := func(name, method, path, body string) {
		writes[name] = func() answer {
			st, h, b := send(method, path, name, body)
			return answer{st, h.Get("Location"), h.Get("Content-Type"), b}
		}
		first[name] = writes[name]()
	}
	do("create", http.MethodPost, "/v1/notes", `{"title":"kept"}`)
	require.Equal(t, http.StatusCreated, first["create"].status, first["create"].body)
	do("delete", http.MethodDelete, first["create"].location, "")
	do("nothing", http.MethodDelete, first["create"].location, "")
	require.Equal(t, http.StatusOK, first["delete"].status)
	require.Equal(t, http.StatusNotFound, first["nothing"].status)

	// Down: the columns the API wrote before 00015.
	_, err = provider.DownTo(ctx, 14)
	require.NoError(t, err)
	old := func(key string) (status int, location sql.NullString, resource string) {
		t.Helper()
		require.NoError(t, sqlDB.QueryRowContext(ctx, `SELECT response_status, response_location, resource FROM operations WHERE key = $1`, key).
			Scan(&status, &location, &resource))
		return
	}
	st, loc, res := old("create")
	require.Equal(t, 201, st)
	require.Equal(t, sql.NullString{String: res, Valid: true}, loc)
	st, loc, _ = old("delete")
	require.Equal(t, 200, st)
	require.False(t, loc.Valid)
	st, loc, _ = old("nothing")
	require.Equal(t, 404, st)
	require.False(t, loc.Valid)

	// Up again: every replay is what the write answered.
	_, err = provider.UpTo(ctx, 16)
	require.NoError(t, err)
	for name, again := range writes {
		a := again()
		require.Equal(t, first[name], a, name)
	}

	// A status that names no outcome stops the migration, nothing lost.
	_, err = provider.DownTo(ctx, 14)
	require.NoError(t, err)
	_, err = sqlDB.ExecContext(ctx, `UPDATE operations SET response_status = 202 WHERE key = 'create'`)
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 15)
	require.ErrorContains(t, err, "names no outcome")
	st, _, _ = old("create")
	require.Equal(t, 202, st)
}
