// Package dbtest gives each test its own freshly migrated PostgreSQL schema
// in a shared test database, so tests run in parallel against real
// PostgreSQL without seeing each other's rows. Test-only.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/db"
)

// DefaultURL is the test database used when QUILL_TEST_DATABASE_URL is not
// set: the local server's quill_test database, created when missing.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/quill_test?sslmode=disable"

// URL returns the test database URL.
func URL() string {
	if u := os.Getenv("QUILL_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var createOnce sync.Once

// Schema creates a new schema, migrates it and returns a URL whose
// connections use it (search_path). The schema is dropped when t ends.
func Schema(t testing.TB) string {
	t.Helper()
	u := EmptySchema(t)
	_, err := Migrate(context.Background(), u)
	require.NoError(t, err)
	return u
}

// Migrate is what "api migrate" does to the database of dbURL: the
// consumer package's tables, then Quill's migrations.
func Migrate(ctx context.Context, dbURL string) (db.MigrateResult, error) {
	return db.Migrate(ctx, dbURL, func(ctx context.Context, p *pgxpool.Pool) error { return consumer.Migrate(ctx, p) })
}

// EmptySchema is Schema without the migrations: for tests of the
// migrations themselves.
func EmptySchema(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	base := URL()
	createOnce.Do(func() {
		// Migrate the base database once: it creates it when missing.
		_, err := Migrate(ctx, base)
		require.NoError(t, err, "test database at %s (set QUILL_TEST_DATABASE_URL)", base)
	})
	schema := randomName("t_")
	require.NoError(t, exec(ctx, base, "CREATE SCHEMA "+schema))
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(cctx, base, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	return WithParam(t, base, "search_path", schema)
}

// WithParam returns dbURL with the query parameter key set to value (a
// session setting such as search_path or application_name).
func WithParam(t testing.TB, dbURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// randomName is prefix and 12 random hex digits: a schema or database name
// no other test uses.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// exec runs one statement on a connection of its own to dbURL.
func exec(ctx context.Context, dbURL, sql string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// Pool returns a pool of at most maxConns connections on a fresh schema,
// closed when t ends.
func Pool(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	u := Schema(t)
	pool, err := db.Open(context.Background(), u, maxConns)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, u
}

// Database creates an empty database of t's own on the test server and
// returns its URL; it is dropped (with FORCE) when t ends. For what is per
// database rather than per schema — LISTEN/NOTIFY above all, which every
// test sharing the database would otherwise hear.
func Database(t testing.TB) string {
	t.Helper()
	u, admin, ident := database(t)
	require.NoError(t, exec(t.Context(), admin, "CREATE DATABASE "+ident))
	return u
}

// MissingDatabase returns the URL of a database of t's own on the test
// server that does not exist yet, for tests of creating it; it is dropped
// (with FORCE) when t ends, if it exists by then.
func MissingDatabase(t testing.TB) string {
	t.Helper()
	u, _, _ := database(t)
	return u
}

// database names a database of t's own and arranges its drop: its URL, the
// URL of the server's postgres database, and its quoted name.
func database(t testing.TB) (dbURL, adminURL, ident string) {
	t.Helper()
	u, err := url.Parse(URL())
	require.NoError(t, err)
	name := randomName("quill_t_")
	admin := *u
	admin.Path = "/postgres"
	ident = pgx.Identifier{name}.Sanitize()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, admin.String(), "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String(), admin.String(), ident
}
