package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/inbox"
)

// record runs QueueRecord (and, when forget is set, QueueForget) in a
// transaction of its own and returns the entries with Fresh set.
func record(t *testing.T, pool *pgxpool.Pool, entries []inbox.Entry, forget []uuid.UUID) []inbox.Entry {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		inbox.QueueRecord(b, "c", time.Now().UTC(), entries)
		if len(forget) > 0 {
			inbox.QueueForget(b, "c", forget)
		}
		return tx.SendBatch(t.Context(), b).Close()
	})
	require.NoError(t, err)
	return entries
}

func TestRecordCountsDeliveriesAndDuplicates(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	a, b, c := uuid.New(), uuid.New(), uuid.New()

	got := record(t, pool, []inbox.Entry{{EventID: a, Deliveries: 3}, {EventID: b, Deliveries: 1, Duplicates: 2}}, nil)
	require.True(t, got[0].Fresh)
	require.True(t, got[1].Fresh)
	r, err := inbox.Get(t.Context(), pool, "c", a)
	require.NoError(t, err)
	require.Equal(t, 3, r.Deliveries)
	require.Equal(t, 0, r.Duplicates)
	r, err = inbox.Get(t.Context(), pool, "c", b)
	require.NoError(t, err)
	require.Equal(t, 2, r.Duplicates, "merged deliveries of one batch count as duplicates")

	// Again: duplicates, counted; the delivery count of the processing stays.
	got = record(t, pool, []inbox.Entry{{EventID: a, Deliveries: 5}, {EventID: b, Deliveries: 1, Duplicates: 1}, {EventID: c, Deliveries: 1}}, nil)
	require.False(t, got[0].Fresh)
	require.False(t, got[1].Fresh)
	require.True(t, got[2].Fresh)
	r, err = inbox.Get(t.Context(), pool, "c", a)
	require.NoError(t, err)
	require.Equal(t, inbox.Row{ProcessedAt: r.ProcessedAt, Deliveries: 3, Duplicates: 1}, r)
	r, err = inbox.Get(t.Context(), pool, "c", b)
	require.NoError(t, err)
	require.Equal(t, 4, r.Duplicates)

	// Another consumer has its own rows.
	_, err = inbox.Get(t.Context(), pool, "other", a)
	require.ErrorIs(t, err, inbox.ErrNotFound)
}

func TestForgetUndoesRecordInTheSameTransaction(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	a, b := uuid.New(), uuid.New()
	got := record(t, pool, []inbox.Entry{{EventID: a, Deliveries: 1}, {EventID: b, Deliveries: 1}}, []uuid.UUID{b})
	require.True(t, got[1].Fresh)
	_, err := inbox.Get(t.Context(), pool, "c", a)
	require.NoError(t, err)
	_, err = inbox.Get(t.Context(), pool, "c", b)
	require.ErrorIs(t, err, inbox.ErrNotFound)
}

func TestDeleteExpired(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	old := uuid.New()
	record(t, pool, []inbox.Entry{{EventID: old, Deliveries: 1}, {EventID: uuid.New(), Deliveries: 1}}, nil)
	_, err := pool.Exec(context.Background(), `UPDATE inbox SET processed_at = now() - interval '2 hours' WHERE event_id = $1`, old)
	require.NoError(t, err)
	n, err := inbox.DeleteExpired(t.Context(), pool, time.Hour, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = inbox.Get(t.Context(), pool, "c", old)
	require.ErrorIs(t, err, inbox.ErrNotFound)
}
