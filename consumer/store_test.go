package consumer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/consumer/internal/testenv"
)

// Two consumers on one database keep their inbox rows apart; each copy of
// an event beyond the first, in one transaction or a later one, is
// counted in its row's duplicates; expired rows go, every consumer's.
func TestStoreInboxOfSeveralConsumers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testenv.EmptySchema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, consumer.Migrate(ctx, pool))
	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	ev := func(id string, deliveries int) consumer.Event {
		return consumer.Event{ID: id, Type: "quill.note.created.v1", Delivery: consumer.Delivery{StreamSeq: 7, Deliveries: deliveries}}
	}
	record := func(durable string, events ...consumer.Event) []bool {
		var fresh []bool
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			fresh, err = store.RecordInbox(ctx, tx, durable, time.Now(), events)
			return err
		}))
		return fresh
	}
	counts := func(durable, id string) (deliveries, duplicates int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT deliveries, duplicates FROM quill_consumer_inbox WHERE consumer = $1 AND event_id = $2`,
			durable, id).Scan(&deliveries, &duplicates))
		return deliveries, duplicates
	}
	a, b := uuid.NewString(), uuid.NewString()

	require.Equal(t, []bool{true, false, true}, record("search", ev(a, 3), ev(a, 1), ev(b, 1)))
	d, dups := counts("search", a)
	require.Equal(t, [2]int{3, 1}, [2]int{d, dups}, "the copy in the same batch is a duplicate")
	require.Equal(t, []bool{true}, record("webhooks", ev(a, 1)), "another consumer's row is its own")
	require.Equal(t, []bool{false, true}, record("search", ev(a, 5), ev(uuid.NewString(), 1)))
	d, dups = counts("search", a)
	require.Equal(t, [2]int{3, 2}, [2]int{d, dups}, "the delivery that committed stays; the redelivery counts")
	_, dups = counts("webhooks", a)
	require.Zero(t, dups)

	_, err = pool.Exec(ctx, `UPDATE quill_consumer_inbox SET processed_at = now() - interval '2 hours' WHERE event_id = $1`, a)
	require.NoError(t, err)
	n, err := store.DeleteExpiredInbox(ctx, time.Hour, 100)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "both consumers' expired rows")
}

// The tools that show every consumer list their open dead letters in one
// id order and count them by consumer; a dead letter re-driven is left
// out of both; a query names one consumer or asks for every one.
func TestStoreDeadLettersOfEveryConsumer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testenv.EmptySchema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, consumer.Migrate(ctx, pool))
	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	for _, durable := range []string{"webhooks", "search", "webhooks", "search"} {
		require.NoError(t, store.WriteDeadLetter(ctx, durable, consumer.DeadLetter{Reason: durable}, time.Now()))
	}
	all, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{AnyConsumer: true})
	require.NoError(t, err)
	require.Len(t, all, 4)
	_, err = pool.Exec(ctx, `UPDATE quill_consumer_dead_letters SET retried_at = now() WHERE id = $1`, all[1].ID)
	require.NoError(t, err)

	open, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{AnyConsumer: true})
	require.NoError(t, err)
	var got []string
	for _, l := range open {
		got = append(got, fmt.Sprint(l.ID-all[0].ID, l.Consumer))
	}
	require.Equal(t, []string{"0webhooks", "2webhooks", "3search"}, got, "the open ones, in id order")
	page, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{AnyConsumer: true, After: all[0].ID, Limit: 1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, all[2].ID, page[0].ID, "a page after a cursor")
	every, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{AnyConsumer: true, All: true})
	require.NoError(t, err)
	require.Len(t, every, 4, "with All, the re-driven one too")

	counts, err := store.OpenDeadLettersByConsumer(ctx)
	require.NoError(t, err)
	require.Equal(t, []consumer.ConsumerDeadLetters{{Consumer: "search", Open: 1}, {Consumer: "webhooks", Open: 2}}, counts)

	_, err = store.DeadLetters(ctx, consumer.DeadLetterQuery{AnyConsumer: true, Consumer: "search"})
	require.Error(t, err, "one consumer and every consumer")
	_, err = store.DeadLetters(ctx, consumer.DeadLetterQuery{})
	require.Error(t, err, "no consumer")
}

// The versions cleanup forgets only the rows of deleted notes, past the
// retention (every consumer's, by the database's clock) or before a
// cutoff (one consumer's); a live note's row stays however old.
func TestStoreForgetsTheVersionsOfDeletedNotes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	store, err := consumer.NewStore(b.pool, "")
	require.NoError(t, err)
	insert := func(durable, note string, deleted bool, age string) {
		_, err := b.pool.Exec(ctx, `INSERT INTO quill_consumer_versions (consumer, tenant, note_id, version, deleted, applied_at)
			VALUES ($1, 'acme', $2, 4, $3, now() - $4::interval)`, durable, note, deleted, age)
		require.NoError(t, err)
	}
	insert("search", "old-deleted", true, "3 hours")
	insert("webhooks", "old-deleted", true, "3 hours")
	insert("search", "young-deleted", true, "10 minutes")
	insert("search", "old-live", false, "30 days")
	insert(b.config().Durable, "old-deleted", true, "3 hours")
	insert(b.config().Durable, "young-deleted", true, "10 minutes")
	left := func() []string {
		rows, err := b.pool.Query(ctx, `SELECT consumer || '/' || note_id FROM quill_consumer_versions ORDER BY 1`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}

	c, err := consumer.New(b.pool, b.js, b.config(), record)
	require.NoError(t, err)
	n, err := c.DeleteVersionsBefore(ctx, time.Now().Add(-time.Hour), 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "this consumer's deleted note before the cutoff")

	n, err = store.DeleteExpiredVersions(ctx, 2*time.Hour, 1)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "up to the limit")
	n, err = store.DeleteExpiredVersions(ctx, 2*time.Hour, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"projection/young-deleted", "search/old-live", "search/young-deleted"}, left())
}
