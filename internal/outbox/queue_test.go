package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/migrations"
)

// queueRow is an outbox_pending row.
type queueRow struct {
	Note   uuid.UUID
	Parked bool
}

// requireQueueMatches checks the invariant migration 00007's triggers keep:
// the queue holds exactly the unpublished events, each with its note and
// parked = (parked_at IS NOT NULL). It returns the queue.
func requireQueueMatches(t *testing.T, pool *pgxpool.Pool, step string) map[int64]queueRow {
	t.Helper()
	ctx := t.Context()
	read := func(sql string) map[int64]queueRow {
		rows, err := pool.Query(ctx, sql)
		require.NoError(t, err)
		out := map[int64]queueRow{}
		for rows.Next() {
			var seq int64
			var r queueRow
			require.NoError(t, rows.Scan(&seq, &r.Note, &r.Parked))
			out[seq] = r
		}
		require.NoError(t, rows.Err())
		return out
	}
	want := read(`SELECT seq, aggregate_id, parked_at IS NOT NULL FROM outbox_events WHERE published_at IS NULL`)
	got := read(`SELECT seq, aggregate_id, parked FROM outbox_pending`)
	require.Equal(t, want, got, "after %s: the queue is the unpublished events", step)
	return got
}

func insertEvent(t *testing.T, pool *pgxpool.Pool, note uuid.UUID) (int64, uuid.UUID) {
	t.Helper()
	ctx := t.Context()
	id := uuid.New()
	err := db.WithTx(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Insert(ctx, tx, outbox.Event{ID: id, Tenant: "t1", AggregateID: note,
			Type: contract.EventNoteCreated, Time: time.Now(), Data: map[string]string{"n": "1"}})
	})
	require.NoError(t, err)
	var seq int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT seq FROM outbox_events WHERE id = $1`, id).Scan(&seq))
	return seq, id
}

// TestQueueFollowsTheOutbox drives every kind of write to outbox_events —
// the writers' inserts, COPY, the relay's mark, release and park, an
// operator's unpark and manual requeue, deletes, TRUNCATE — and checks
// after each that the queue is exactly the unpublished events.
func TestQueueFollowsTheOutbox(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 4)
	ctx := t.Context()
	noteA, noteB := uuid.New(), uuid.New()

	a1, _ := insertEvent(t, pool, noteA)
	a2, _ := insertEvent(t, pool, noteA)
	b1, b1ID := insertEvent(t, pool, noteB)
	q := requireQueueMatches(t, pool, "inserts")
	require.Len(t, q, 3)

	_, err := pool.CopyFrom(ctx, pgx.Identifier{"outbox_events"},
		[]string{"id", "tenant", "aggregate_id", "type", "payload", "created_at"},
		pgx.CopyFromRows([][]any{
			{pgtype.UUID{Bytes: uuid.New(), Valid: true}, "t1", pgtype.UUID{Bytes: noteB, Valid: true}, "note.deleted", []byte(`{}`), time.Now()},
			{pgtype.UUID{Bytes: uuid.New(), Valid: true}, "t1", pgtype.UUID{Bytes: uuid.New(), Valid: true}, "note.created", []byte(`{}`), time.Now()},
		}))
	require.NoError(t, err)
	require.Len(t, requireQueueMatches(t, pool, "COPY"), 5)

	require.NoError(t, outbox.MarkPublished(ctx, pool, "r1", []outbox.Published{{Seq: a1, StreamSeq: 1}, {Seq: b1, StreamSeq: 2}}))
	q = requireQueueMatches(t, pool, "mark")
	require.NotContains(t, q, a1)
	require.NotContains(t, q, b1)
	require.Len(t, q, 3)

	require.NoError(t, outbox.Release(ctx, pool, []int64{a2}, "nats down"))
	requireQueueMatches(t, pool, "release")

	require.NoError(t, outbox.Park(ctx, pool, a2, "payload too large"))
	q = requireQueueMatches(t, pool, "park")
	require.True(t, q[a2].Parked)

	var a2ID uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox_events WHERE seq = $1`, a2).Scan(&a2ID))
	require.NoError(t, outbox.Unpark(ctx, pool, a2ID))
	q = requireQueueMatches(t, pool, "unpark")
	require.False(t, q[a2].Parked)

	// An operator sends a published event again by clearing published_at.
	_, err = pool.Exec(ctx, `UPDATE outbox_events SET published_at = NULL, stream_seq = NULL WHERE id = $1`, b1ID)
	require.NoError(t, err)
	q = requireQueueMatches(t, pool, "manual requeue")
	require.Contains(t, q, b1)

	_, err = pool.Exec(ctx, `DELETE FROM outbox_events WHERE seq = $1`, a2)
	require.NoError(t, err)
	require.NotContains(t, requireQueueMatches(t, pool, "delete"), a2)

	n, err := outbox.UnparkAll(ctx, pool)
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = pool.Exec(ctx, `TRUNCATE outbox_events`)
	require.NoError(t, err)
	require.Empty(t, requireQueueMatches(t, pool, "truncate"))
}

// TestQueueMigrationCopiesPendingEvents migrates a schema to 00006, writes
// published, pending and parked events the old way, then applies 00007:
// the queue starts with exactly the unpublished ones.
func TestQueueMigrationCopiesPendingEvents(t *testing.T) {
	t.Parallel()
	u := dbtest.EmptySchema(t)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(u)
	require.NoError(t, err)
	sqlDB := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = sqlDB.Close() })
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS)
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 6)
	require.NoError(t, err)

	exec := func(db *sql.DB, q string, args ...any) {
		t.Helper()
		_, err := db.ExecContext(ctx, q, args...)
		require.NoError(t, err)
	}
	note := uuid.New()
	for i, state := range []string{"published", "pending", "parked", "pending"} {
		exec(sqlDB, `INSERT INTO outbox_events (id, tenant, aggregate_id, type, payload, created_at) VALUES ($1, 't1', $2, 'note.created', '{}', now())`,
			uuid.New(), note)
		switch state {
		case "published":
			exec(sqlDB, `UPDATE outbox_events SET published_at = now(), stream_seq = $1 WHERE seq = $1`, i+1)
		case "parked":
			exec(sqlDB, `UPDATE outbox_events SET parked_at = now(), parked_reason = 'too large' WHERE seq = $1`, i+1)
		}
	}
	pool, err := db.Open(ctx, u, 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// As db.Migrate: the consumer package's tables before the rest (00014
	// moves rows into them).
	require.NoError(t, consumer.Migrate(ctx, pool))
	_, err = provider.Up(ctx)
	require.NoError(t, err)
	q := requireQueueMatches(t, pool, "migration")
	require.Equal(t, map[int64]queueRow{2: {note, false}, 3: {note, true}, 4: {note, false}}, q)

	// And the way back.
	_, err = provider.DownTo(ctx, 6)
	require.NoError(t, err)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('outbox_pending') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "00007 down drops the queue")
}

// TestClaimDropsStaleQueueRows: a queue row whose event is published (only
// a write with the triggers disabled can leave one) is claimed once,
// dropped, and never returned; the events behind it are.
func TestClaimDropsStaleQueueRows(t *testing.T) {
	t.Parallel()
	pool, u := dbtest.Pool(t, 4)
	ctx := context.Background()
	note := uuid.New()
	first, _ := insertEvent(t, pool, note)
	require.NoError(t, outbox.MarkPublished(ctx, pool, "r1", []outbox.Published{{Seq: first, StreamSeq: 1}}))
	second, _ := insertEvent(t, pool, uuid.New())
	_, err := pool.Exec(ctx, `INSERT INTO outbox_pending (seq, aggregate_id) VALUES ($1, $2)`, first, note)
	require.NoError(t, err)

	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	space, err := outbox.LockSpace(ctx, conn)
	require.NoError(t, err)
	got, err := outbox.Claim(ctx, conn, space, nil, nil, 10)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, second, got[0].Seq)
	requireQueueMatches(t, pool, "claim")
}

// TestRetryQueuesAnUnqueuedEvent: "relay events retry ID" (Unpark) also
// queues again an unpublished event whose queue row is missing, and
// refuses an event that is queued and not parked.
func TestRetryQueuesAnUnqueuedEvent(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 4)
	ctx := t.Context()
	seq, id := insertEvent(t, pool, uuid.New())
	_, other := insertEvent(t, pool, uuid.New())
	require.ErrorIs(t, outbox.Unpark(ctx, pool, id), outbox.ErrNotParked, "queued, not parked: nothing to retry")

	_, err := pool.Exec(ctx, `DELETE FROM outbox_pending`)
	require.NoError(t, err)
	require.NoError(t, outbox.Unpark(ctx, pool, id))
	var queued []int64
	rows, err := pool.Query(ctx, `SELECT seq FROM outbox_pending`)
	require.NoError(t, err)
	queued, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{seq}, queued, "the retried event is queued again, the other not yet")

	n, err := outbox.UnparkAll(ctx, pool)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "retry --all queues the other")
	require.Len(t, requireQueueMatches(t, pool, "retry --all"), 2)
	require.ErrorIs(t, outbox.Unpark(ctx, pool, other), outbox.ErrNotParked)
}

// TestClaimHoldsExactlyWhatItReturns: the claim locks the oldest queued
// event of each note and nothing else — an event behind another of its
// note is locked only for the instant it takes to see that and let go,
// and a LIMIT leaves the rest unlocked — so the session's advisory locks
// are exactly the events returned; a second session skips them.
func TestClaimHoldsExactlyWhatItReturns(t *testing.T) {
	t.Parallel()
	pool, u := dbtest.Pool(t, 4)
	ctx := context.Background()
	x, y, z := uuid.New(), uuid.New(), uuid.New()
	x1, _ := insertEvent(t, pool, x)
	_, _ = insertEvent(t, pool, x) // behind x1
	y1, _ := insertEvent(t, pool, y)
	z1, _ := insertEvent(t, pool, z)

	session := func() (*pgx.Conn, int32) {
		conn, err := pgx.Connect(ctx, u)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(ctx) })
		space, err := outbox.LockSpace(ctx, conn)
		require.NoError(t, err)
		return conn, space
	}
	locks := func(conn *pgx.Conn) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND pid = $1`, int32(conn.PgConn().PID())).Scan(&n))
		return n
	}
	seqs := func(ps []outbox.Pending) []int64 {
		out := []int64{}
		for _, p := range ps {
			out = append(out, p.Seq)
		}
		return out
	}

	a, spaceA := session()
	got, err := outbox.Claim(ctx, a, spaceA, nil, nil, 2)
	require.NoError(t, err)
	require.Equal(t, []int64{x1, y1}, seqs(got), "oldest of each note, in commit order, up to the limit")
	require.Equal(t, 2, locks(a))

	b, spaceB := session()
	got, err = outbox.Claim(ctx, b, spaceB, nil, nil, 10)
	require.NoError(t, err)
	require.Equal(t, []int64{z1}, seqs(got), "another session skips what the first holds and what waits behind it")
	require.Equal(t, 1, locks(b))

	got, err = outbox.Claim(ctx, a, spaceA, nil, []int64{x1, y1}, 10)
	require.NoError(t, err)
	require.Empty(t, got, "nothing more is claimable")
	require.Equal(t, 2, locks(a), "no lock taken for what was not returned")
}

// TestQueueTriggersAreBoundToTheirSchema: a write from a session whose
// search_path leads elsewhere (here: the database's public schema, which
// has a queue of its own) still queues the event in the outbox's schema.
func TestQueueTriggersAreBoundToTheirSchema(t *testing.T) {
	t.Parallel()
	pool, u := dbtest.Pool(t, 2)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(u)
	require.NoError(t, err)
	schema := cfg.RuntimeParams["search_path"]
	require.NotEmpty(t, schema)
	delete(cfg.RuntimeParams, "search_path")
	other, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close(ctx) })
	var path string
	require.NoError(t, other.QueryRow(ctx, `SELECT current_schema()`).Scan(&path))
	require.NotEqual(t, schema, path)

	_, err = other.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "outbox_events"}.Sanitize()+
		` (id, tenant, aggregate_id, type, payload, created_at) VALUES ($1, 't1', $2, 'note.created', '{}', now())`,
		uuid.New(), uuid.New())
	require.NoError(t, err)
	require.Len(t, requireQueueMatches(t, pool, "insert from another search_path"), 1)
}
