package db

import (
	"context"
	"errors"
	"fmt"
	"hash/crc64"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/quillhq/quill/migrations"
)

// sqlMigrationSettings are the migrations' session settings: no
// statement_timeout.
const sqlMigrationSettings = "SET statement_timeout = 0"

// MigrateResult says what Migrate did.
type MigrateResult struct {
	CreatedDatabase bool
	Applied         []string
	Version         int64
}

// Migrate creates the database named in url when it is missing (and the role
// may create it), then applies every pending embedded migration. Several
// processes may run it at once: goose holds a PostgreSQL session advisory lock
// while it migrates, and a concurrent CREATE DATABASE is tolerated.
//
// The lock needs a session that lasts: when url reaches a transaction
// pooler, Migrate returns an error wrapping ErrTransactionPooler before it
// writes anything.
//
// consumerTables runs first, on a pool of the same database and session
// settings: it is consumer.Migrate, the consumer package's tables, which a
// migration of Quill's own (00014) moves rows into. It comes from the
// caller because this package does not link the consumer package, which
// would bring NATS and HTTP into every package that speaks to PostgreSQL.
// Its error is returned wrapped.
func Migrate(ctx context.Context, url string, consumerTables func(context.Context, *pgxpool.Pool) error) (MigrateResult, error) {
	var res MigrateResult
	pc, err := pgx.ParseConfig(url)
	if err != nil {
		return res, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	// A probe that cannot connect (the database may not exist yet) leaves
	// the error to ensureDatabase.
	if route, err := ProbeRoute(ctx, pc); err == nil && route == RouteTransactionPooler {
		return res, fmt.Errorf("DATABASE_URL %w", ErrTransactionPooler)
	}
	created, err := ensureDatabase(ctx, url)
	if err != nil {
		return res, err
	}
	res.CreatedDatabase = created

	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return res, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	cfg := pcfg.ConnConfig
	if _, ok := cfg.RuntimeParams["statement_timeout"]; !ok {
		// A migration may rewrite or index a large table: it is not cut
		// short by the role's or database's statement_timeout (decision
		// 0070). SET, not a startup parameter, which a session pooler
		// refuses.
		pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			return c.PgConn().Exec(ctx, sqlMigrationSettings).Close()
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, fmt.Errorf("connect: %w", Translate(err))
	}
	defer pool.Close()
	if err := consumerTables(ctx, pool); err != nil {
		return res, fmt.Errorf("apply migrations: %w", Translate(err))
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()

	// One lock per schema: migrations of one schema serialize, those of
	// different schemas (tests) do not wait for each other. Poll each second
	// for up to five minutes.
	lockID := lock.DefaultLockID
	if sp := cfg.RuntimeParams["search_path"]; sp != "" {
		lockID ^= int64(crc64.Checksum([]byte(sp), crc64.MakeTable(crc64.ECMA)) >> 1)
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return res, fmt.Errorf("migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS,
		goose.WithSessionLocker(locker))
	if err != nil {
		return res, fmt.Errorf("load migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("apply migrations: %w", Translate(err))
	}
	for _, r := range results {
		res.Applied = append(res.Applied, r.Source.Path)
	}
	res.Version, err = provider.GetDBVersion(ctx)
	if err != nil {
		return res, fmt.Errorf("read schema version: %w", Translate(err))
	}
	return res, nil
}

// ensureDatabase connects to url; when the server answers that the database
// does not exist (3D000) it connects to the maintenance database "postgres"
// and creates it.
func ensureDatabase(ctx context.Context, url string) (bool, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return false, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return false, conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return false, fmt.Errorf("connect to %s:%d/%s: %w", cfg.Host, cfg.Port, cfg.Database, Translate(err))
	}
	name := cfg.Database
	admin := cfg.Copy()
	admin.Database = "postgres"
	aconn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, fmt.Errorf("connect to maintenance database to create %q: %w", name, Translate(err))
	}
	defer aconn.Close(context.WithoutCancel(ctx))
	_, err = aconn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		return false, nil // created by a concurrent migrate
	}
	if err != nil {
		return false, fmt.Errorf("create database %q: %w", name, err)
	}
	return true, nil
}
