package dbtest_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
)

// The pooler reaches the test's schema, pools by transaction (another
// client's statement runs on the backend a session just let go of), and
// refuses a startup parameter it does not know. (Simple protocol: a
// statement prepared by one client would be met by the other on the shared
// backend; package db's tests show Quill's pools cope.)
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pooled := dbtest.PgBouncer(t, dbtest.Schema(t))

	a, err := pgx.Connect(ctx, pooled)
	require.NoError(t, err)
	defer a.Close(ctx)
	var table string
	require.NoError(t, a.QueryRow(ctx, "SELECT to_regclass('notes')::text", pgx.QueryExecModeSimpleProtocol).Scan(&table))
	require.Equal(t, "notes", table, "the schema's tables are reached through the pooler")
	var pidA int32
	require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pidA))

	b, err := pgx.Connect(ctx, pooled)
	require.NoError(t, err)
	defer b.Close(ctx)
	var pidB int32
	require.NoError(t, b.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pidB))
	require.Equal(t, pidA, pidB, "transaction pooling: b's statement runs on the backend a let go of")

	_, err = pgx.Connect(ctx, dbtest.WithParam(t, pooled, "idle_in_transaction_session_timeout", "60s"))
	require.ErrorContains(t, err, "unsupported startup parameter")
}
