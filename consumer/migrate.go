package consumer

import (
	"context"
	"embed"
	"fmt"
	"hash/crc64"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// DefaultTablePrefix is the prefix of the consumer package's tables:
// quill_consumer_inbox, quill_consumer_dead_letters,
// quill_consumer_versions (the version guard's, Config.Versions) and the
// migrations' version table quill_consumer_schema_version.
const DefaultTablePrefix = "quill_consumer_"

// prefixRE is what a table prefix may be: a lower-case SQL identifier
// start, so that the names need no quoting and read the same in psql.
var prefixRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// tables are the consumer's table names for one prefix.
type tables struct {
	inbox, deadLetters, versions, version string
}

func tablesOf(prefix string) (tables, error) {
	if !prefixRE.MatchString(prefix) {
		return tables{}, fmt.Errorf("table prefix %q: must match %s", prefix, prefixRE)
	}
	return tables{inbox: prefix + "inbox", deadLetters: prefix + "dead_letters", versions: prefix + "versions",
		version: prefix + "schema_version"}, nil
}

// expand substitutes the table names into a migration's SQL.
func (t tables) expand(sql string) string {
	return strings.NewReplacer("{{inbox}}", t.inbox, "{{dead_letters}}", t.deadLetters, "{{versions}}", t.versions).Replace(sql)
}

// MigrateOption configures Migrate.
type MigrateOption func(*migrateConfig)

type migrateConfig struct {
	prefix string
}

// WithTablePrefix makes Migrate create tables named prefix+"inbox",
// prefix+"dead_letters", prefix+"versions" and prefix+"schema_version" instead of
// DefaultTablePrefix's; the Consumer must be given the same prefix
// (Config.TablePrefix).
func WithTablePrefix(prefix string) MigrateOption {
	return func(c *migrateConfig) { c.prefix = prefix }
}

// Migrate applies the consumer package's pending migrations — the inbox,
// dead-letter and versions tables — to the database of pool, in the schema its
// search_path names. The applied versions are recorded in a version table
// of their own (<prefix>schema_version), so that the service's own goose
// migrations, in goose_db_version, are left alone. Several processes may
// run it at once: a PostgreSQL session advisory lock, one per schema and
// prefix, serialises them (for up to 5 minutes); pool must therefore reach
// PostgreSQL directly or through a session pooler, not a transaction pooler.
//
// The version table and the lock are goose's (its PostgreSQL table layout,
// its default lock id mixed with the schema and table): the package ran its
// migrations with goose until decision 0097, and a database migrated then,
// or a process of an older release migrating beside a newer one, reads and
// serialises the same way. Goose itself is no longer a dependency: its
// module brings every database driver it supports into an importer's
// module graph.
//
// It returns an error for a prefix that is not a lower-case identifier, and
// a wrapped database error when a migration cannot be applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...MigrateOption) error {
	cfg := migrateConfig{prefix: DefaultTablePrefix}
	for _, o := range opts {
		o(&cfg)
	}
	t, err := tablesOf(cfg.prefix)
	if err != nil {
		return err
	}
	migs, err := migrations(t)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("consumer migrations: %w", err)
	}
	defer conn.Release()
	var schema string
	if err := conn.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return fmt.Errorf("consumer migrations: current schema: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, migrateLockTimeout)
	defer cancel()
	id := lockID(schema, t.version)
	if _, err := conn.Exec(lctx, "SELECT pg_advisory_lock($1)", id); err != nil {
		return fmt.Errorf("consumer migrations: lock: %w", err)
	}
	defer func() {
		// The session's lock goes with the session if this fails.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", id); err != nil {
			_ = conn.Conn().Close(uctx) // closing the session ends its lock
		}
	}()
	applied, err := appliedVersions(ctx, conn.Conn(), t.version)
	if err != nil {
		return fmt.Errorf("apply consumer migrations (%s*): %w", cfg.prefix, err)
	}
	for _, m := range migs {
		if applied[m.version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn.Conn(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("consumer migration %s: %w", m.file, err)
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+t.version+" (version_id, is_applied) VALUES ($1, true)", m.version)
			return err
		})
		if err != nil {
			return fmt.Errorf("apply consumer migrations (%s*): %w", cfg.prefix, err)
		}
	}
	return nil
}

// migrateLockTimeout bounds the wait for another process's migrations.
const migrateLockTimeout = 5 * time.Minute

// migration is one embedded SQL file with the table names substituted.
type migration struct {
	version int64
	file    string
	sql     string
}

// migrations are the embedded SQL files, in version order, each with the
// table names substituted (a migration tool's own files could not carry a
// configurable table name).
func migrations(t tables) ([]migration, error) {
	files, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("consumer migrations: %w", err)
	}
	var out []migration
	for _, f := range files {
		num, _, _ := strings.Cut(path.Base(f), "_")
		version, err := strconv.ParseInt(num, 10, 64)
		if err != nil || version < 1 {
			return nil, fmt.Errorf("consumer migration %s: no version number", f)
		}
		b, err := migrationFS.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("consumer migration %s: %w", f, err)
		}
		out = append(out, migration{version: version, file: f, sql: t.expand(string(b))})
	}
	slices.SortFunc(out, func(a, b migration) int { return int(a.version - b.version) })
	return out, nil
}

// appliedVersions creates the version table (goose's PostgreSQL layout,
// with its version 0) when it is missing and returns the applied versions:
// each version's latest row says whether it is applied, as goose reads it.
func appliedVersions(ctx context.Context, conn *pgx.Conn, table string) (map[int64]bool, error) {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)`, table).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE `+table+` (
			id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
			version_id bigint NOT NULL,
			is_applied boolean NOT NULL,
			tstamp timestamp NOT NULL DEFAULT now()
		)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (version_id, is_applied) VALUES (0, true)`)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("version table %s: %w", table, err)
	}
	rows, err := conn.Query(ctx, `SELECT version_id, is_applied FROM `+table+` ORDER BY id DESC`)
	if err != nil {
		return nil, fmt.Errorf("version table %s: %w", table, err)
	}
	applied := map[int64]bool{}
	seen := map[int64]bool{}
	var v int64
	var ok bool
	_, err = pgx.ForEachRow(rows, []any{&v, &ok}, func() error {
		if !seen[v] {
			seen[v], applied[v] = true, ok
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("version table %s: %w", table, err)
	}
	return applied, nil
}

// gooseLockID is goose's default advisory lock id (its lock package's
// DefaultLockID), which the package's lock ids were derived from while it
// migrated with goose: an older process and a newer one take the same lock.
const gooseLockID int64 = 4097083626

// lockID is the advisory lock of one version table in one schema:
// consumers of one prefix and schema serialise their migrations, those of
// other schemas (tests, tenants) do not wait for them, and none waits for
// the service's own goose lock.
func lockID(schema, versionTable string) int64 {
	return gooseLockID ^ int64(crc64.Checksum([]byte("quill-consumer:"+schema+"."+versionTable), crc64.MakeTable(crc64.ECMA))>>1)
}
