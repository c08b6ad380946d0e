package consumer_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/dbtest"
)

func TestMigrateCreatesPrefixedTablesWithAVersionTableOfTheirOwn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, dbtest.EmptySchema(t))
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
