package consumer_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/consumer/internal/testenv"
)

func TestMigrateCreatesPrefixedTablesWithAVersionTableOfTheirOwn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testenv.EmptySchema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	tables := func() []string {
		rows, err := pool.Query(ctx, `SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1`)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			out = append(out, n)
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.NoError(t, consumer.Migrate(ctx, pool))
	require.NoError(t, consumer.Migrate(ctx, pool), "a second run applies nothing")
	require.NoError(t, consumer.Migrate(ctx, pool, consumer.WithTablePrefix("search_")))
	require.Equal(t, []string{"quill_consumer_dead_letters", "quill_consumer_inbox", "quill_consumer_schema_version", "quill_consumer_versions",
		"search_dead_letters", "search_inbox", "search_schema_version", "search_versions"}, tables(),
		"no goose_db_version: the service's own migrations keep theirs")

	err = consumer.Migrate(ctx, pool, consumer.WithTablePrefix("x; DROP TABLE y; --"))
	require.ErrorContains(t, err, "table prefix")
}

// Migrate reads the version table as goose wrote it (the package migrated
// with goose until decision 0097): a version whose latest row is applied
// is skipped, one that is missing, or whose latest row says it was rolled
// back, runs again — here 00003, the versions table.
func TestMigrateContinuesTheVersionTableGooseWrote(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testenv.EmptySchema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, consumer.Migrate(ctx, pool))
	count := func(sql string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	require.Equal(t, 4, count(`SELECT count(*) FROM quill_consumer_schema_version WHERE is_applied`), "versions 0 to 3, goose's layout")

	_, err = pool.Exec(ctx, `DROP TABLE quill_consumer_versions; INSERT INTO quill_consumer_schema_version (version_id, is_applied) VALUES (3, false)`)
	require.NoError(t, err)
	// 1 and 2 running again would fail: their tables exist.
	require.NoError(t, consumer.Migrate(ctx, pool), "3 is rolled back: it runs again, alone")
	require.Equal(t, 1, count(`SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = 'quill_consumer_versions'`))
	require.NoError(t, consumer.Migrate(ctx, pool), "then nothing is pending")
	require.Equal(t, 5, count(`SELECT count(*) FROM quill_consumer_schema_version WHERE is_applied`))
}
