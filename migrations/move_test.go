package migrations_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/migrations"
)

// oldSchema migrates a new schema to the last version before the consumer
// package's tables were shared (00012), as a deployment of that release
// has it, and returns its URL and a pool.
func oldSchema(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := t.Context()
	u := dbtest.EmptySchema(t)
	pool, err := pgxpool.New(ctx, u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 12)
	require.NoError(t, err)
	return u, pool
}

// TestMoveKeepsEveryRowOfEveryConsumer writes inbox and dead-letter rows
// of two consumers with the old schema, migrates, and finds each row once
// in the consumer package's tables, under its consumer, with its counts,
// times and dead-letter id, and the old tables gone.
func TestMoveKeepsEveryRowOfEveryConsumer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u, pool := oldSchema(t)
	at := time.Date(2026, 11, 30, 10, 0, 0, 123456000, time.UTC)
	a, b := uuid.New(), uuid.New()
	_, err := pool.Exec(ctx, `INSERT INTO inbox (consumer, event_id, processed_at, deliveries, duplicates)
		VALUES ('attachment-worker', $1, $3, 3, 2), ('attachment-worker', $2, $3, 1, 0), ('webhooks', $1, $3, 1, 1)`, a, b, at)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO dead_letters (consumer, event_id, stream_seq, subject, payload, headers, error, deliveries, created_at, retried_at)
		VALUES ('attachment-worker', $1, 7, 'quill.acme.note.created', 'p1', '{"Nats-Msg-Id": ["m1"]}', 'boom', 10, $2, NULL),
		       ('webhooks', 'not-an-event', 8, 'quill.acme.note.deleted', 'p2', '{}', 'bad', 1, $2, $2),
		       ('attachment-worker', $1, 9, 'quill.acme.note.created', 'p3', '{}', 'again', 10, $2, NULL)`, a.String(), at)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM dead_letters WHERE id = 3`) // ids with a hole, as retention leaves none but a test may
	require.NoError(t, err)

	_, err = dbtest.Migrate(ctx, u)
	require.NoError(t, err)

	type inboxRow struct {
		Consumer    string
		EventID     uuid.UUID
		Deliveries  int
		Duplicates  int
		ProcessedAt time.Time
	}
	rows, err := pool.Query(ctx, `SELECT consumer, event_id, deliveries, duplicates, processed_at FROM quill_consumer_inbox ORDER BY consumer, deliveries DESC`)
	require.NoError(t, err)
	var inbox []inboxRow
	for rows.Next() {
		var r inboxRow
		require.NoError(t, rows.Scan(&r.Consumer, &r.EventID, &r.Deliveries, &r.Duplicates, &r.ProcessedAt))
		r.ProcessedAt = r.ProcessedAt.UTC()
		inbox = append(inbox, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []inboxRow{
		{"attachment-worker", a, 3, 2, at}, {"attachment-worker", b, 1, 0, at}, {"webhooks", a, 1, 1, at},
	}, inbox)

	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	worker, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: "attachment-worker", All: true})
	require.NoError(t, err)
	require.Len(t, worker, 1)
	require.Equal(t, int64(1), worker[0].ID, "the id an operator retries by is kept")
	require.Equal(t, "boom", worker[0].Reason)
	require.Equal(t, map[string][]string{"Nats-Msg-Id": {"m1"}}, worker[0].Headers)
	require.Equal(t, []byte("p1"), worker[0].Payload)
	require.Equal(t, int64(7), worker[0].StreamSeq)
	require.Nil(t, worker[0].RetriedAt)
	hooks, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: "webhooks", All: true})
	require.NoError(t, err)
	require.Len(t, hooks, 1)
	require.Equal(t, int64(2), hooks[0].ID)
	require.NotNil(t, hooks[0].RetriedAt, "a re-driven dead letter stays re-driven")
	open, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: "webhooks"})
	require.NoError(t, err)
	require.Empty(t, open)

	// A new dead letter takes an id after the moved ones.
	require.NoError(t, store.WriteDeadLetter(ctx, "attachment-worker", consumer.DeadLetter{Reason: "new"}, at))
	worker, err = store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: "attachment-worker"})
	require.NoError(t, err)
	require.Len(t, worker, 2)
	require.Greater(t, worker[1].ID, int64(2))

	var old int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_name IN ('inbox', 'dead_letters')`).Scan(&old))
	require.Zero(t, old, "the old tables are gone")
}

// TestMoveBesideRowsOfThePackagesOwn: when a consumer built on the
// package already kept dead letters in the schema, the moved ones take new
// ids after its own, and no row of either is lost.
func TestMoveBesideRowsOfThePackagesOwn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u, pool := oldSchema(t)
	require.NoError(t, consumer.Migrate(ctx, pool))
	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	at := time.Now()
	require.NoError(t, store.WriteDeadLetter(ctx, "search", consumer.DeadLetter{Reason: "its own"}, at))
	_, err = pool.Exec(ctx, `INSERT INTO dead_letters (consumer, event_id, stream_seq, subject, payload, error, deliveries, created_at)
		VALUES ('attachment-worker', 'e', 1, 's', 'p', 'moved', 10, now())`)
	require.NoError(t, err)

	_, err = dbtest.Migrate(ctx, u)
	require.NoError(t, err)

	own, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: "search"})
	require.NoError(t, err)
	require.Len(t, own, 1)
	moved, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: "attachment-worker"})
	require.NoError(t, err)
	require.Len(t, moved, 1)
	require.Equal(t, "moved", moved[0].Reason)
	require.Greater(t, moved[0].ID, own[0].ID)
}
