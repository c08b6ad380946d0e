package consumer

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"hash/crc64"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
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
// prefix, serialises them; pool must therefore reach PostgreSQL directly or
// through a session pooler, not a transaction pooler.
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
	migs, err := goMigrations(t)
	if err != nil {
		return err
	}
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return fmt.Errorf("consumer migrations: current schema: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close() // the pool stays open
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID(schema, t.version)), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, nil,
		goose.WithTableName(t.version),
		goose.WithGoMigrations(migs...),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(locker),
		goose.WithSlog(slog.New(slog.DiscardHandler)))
	if err != nil {
		return fmt.Errorf("consumer migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("apply consumer migrations (%s*): %w", cfg.prefix, err)
	}
	return nil
}

// goMigrations turns each embedded SQL file into a goose migration that
// runs it, with the table names substituted, in one transaction. Goose's
// own SQL files could not carry a configurable table name.
func goMigrations(t tables) ([]*goose.Migration, error) {
	files, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("consumer migrations: %w", err)
	}
	var out []*goose.Migration
	for _, f := range files {
		num, _, _ := strings.Cut(path.Base(f), "_")
		version, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("consumer migration %s: no version number", f)
		}
		b, err := migrationFS.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("consumer migration %s: %w", f, err)
		}
		stmt := t.expand(string(b))
		out = append(out, goose.NewGoMigration(version, &goose.GoFunc{
			RunTx: func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("consumer migration %s: %w", f, err)
				}
				return nil
			},
		}, nil))
	}
	return out, nil
}

// lockID is the advisory lock of one version table in one schema:
// consumers of one prefix and schema serialise their migrations, those of
// other schemas (tests, tenants) do not wait for them, and none waits for
// the service's own goose lock.
func lockID(schema, versionTable string) int64 {
	return lock.DefaultLockID ^ int64(crc64.Checksum([]byte("quill-consumer:"+schema+"."+versionTable), crc64.MakeTable(crc64.ECMA))>>1)
}
