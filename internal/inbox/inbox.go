// Package inbox deduplicates consumed events: a consumer records each event
// id in the same transaction as the effect of processing it, so a redelivered
// event — after a crash before the acknowledgement, or republished beyond the
// stream's duplicate window — is recognised and has no second effect.
//
// Each row also keeps durable counts for audits: the delivery count of the
// message whose processing committed (deliveries) and how many other
// deliveries of the event were recognised as duplicates (duplicates).
package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/quillhq/quill/internal/db"
)

// Execer runs a statement: a transaction, normally.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier runs a query.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotFound is returned by Get for an event the consumer has no row for.
var ErrNotFound = errors.New("event not in the inbox")

const (
	// One row per event id: the caller merges deliveries of the same event
	// (ON CONFLICT DO UPDATE cannot touch a row twice in one statement) and
	// passes the number merged away as duplicates. On a conflict the row
	// exists already and every delivery of the statement is a duplicate.
	// xmax is 0 only on a row version this statement inserted; the update
	// of a conflicting row sets it to the updating transaction.
	sqlRecord = `INSERT INTO inbox AS i (consumer, event_id, processed_at, deliveries, duplicates)
	SELECT $1, e.event_id, $2, e.deliveries, e.duplicates
	FROM unnest($3::uuid[], $4::int[], $5::int[]) AS e(event_id, deliveries, duplicates)
	ON CONFLICT (consumer, event_id) DO UPDATE SET duplicates = i.duplicates + 1 + excluded.duplicates
	RETURNING i.event_id, i.xmax = 0`

	sqlForget = `DELETE FROM inbox WHERE consumer = $1 AND event_id = ANY($2::uuid[])`

	sqlGet = `SELECT processed_at, deliveries, duplicates FROM inbox WHERE consumer = $1 AND event_id = $2`

	sqlDeleteExpired = `DELETE FROM inbox WHERE (consumer, event_id) IN (
		SELECT consumer, event_id FROM inbox WHERE processed_at < now() - $1::interval
		ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED)`
)

// Entry is one event to record and, once the queued statement ran, whether
// it was new.
type Entry struct {
	// EventID is the consumed event's id.
	EventID uuid.UUID
	// Deliveries is the delivery count (NumDelivered) of the message being
	// processed; stored only when the row is new.
	Deliveries int
	// Duplicates is the number of other deliveries of the same event
	// recognised by the caller itself (two deliveries in one batch).
	Duplicates int
	// Fresh is set when the statement ran: true when the row was inserted
	// (process the event), false when it existed (a duplicate: its
	// duplicates count was incremented by 1 + Duplicates).
	Fresh bool
}

// QueueRecord adds to b, which must run in the transaction that writes the
// processing's effect, the recording of entries (distinct event ids) as
// processed by consumer at now, and sets each entry's Fresh when b's results
// are read. A concurrent transaction recording the same id makes the
// statement wait for it and then see its outcome. The statement's error
// (wrapped) is returned by the batch results.
func QueueRecord(b *pgx.Batch, consumer string, now time.Time, entries []Entry) {
	ids := make([]pgtype.UUID, len(entries))
	deliveries := make([]int32, len(entries))
	dups := make([]int32, len(entries))
	at := make(map[uuid.UUID]int, len(entries))
	for i, e := range entries {
		ids[i] = pgtype.UUID{Bytes: e.EventID, Valid: true}
		deliveries[i] = int32(max(e.Deliveries, 1))
		dups[i] = int32(e.Duplicates)
		at[e.EventID] = i
	}
	b.Queue(sqlRecord, consumer, now, ids, deliveries, dups).Query(func(rows pgx.Rows) error {
		var id pgtype.UUID
		var fresh bool
		_, err := pgx.ForEachRow(rows, []any{&id, &fresh}, func() error {
			if i, ok := at[id.Bytes]; ok {
				entries[i].Fresh = fresh
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("inbox record: %w", err)
		}
		return nil
	})
}

// QueueForget adds to b the deletion of consumer's rows of eventIDs: the
// caller recorded them earlier in the same transaction (QueueRecord) and
// then could not process the events, which must stay unprocessed.
func QueueForget(b *pgx.Batch, consumer string, eventIDs []uuid.UUID) {
	ids := make([]pgtype.UUID, len(eventIDs))
	for i, id := range eventIDs {
		ids[i] = pgtype.UUID{Bytes: id, Valid: true}
	}
	b.Queue(sqlForget, consumer, ids)
}

// Row is what the inbox remembers of one processed event.
type Row struct {
	ProcessedAt time.Time
	// Deliveries is the delivery count of the message whose processing
	// committed.
	Deliveries int
	// Duplicates counts the other deliveries recognised as duplicates.
	Duplicates int
}

// Get returns consumer's row for eventID, or ErrNotFound.
func Get(ctx context.Context, q Querier, consumer string, eventID uuid.UUID) (Row, error) {
	var r Row
	err := q.QueryRow(ctx, sqlGet, consumer, pgtype.UUID{Bytes: eventID, Valid: true}).Scan(&r.ProcessedAt, &r.Deliveries, &r.Duplicates)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("inbox %s %s: %w", consumer, eventID, ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("inbox get: %w", err)
	}
	return r, nil
}

// DeleteExpired deletes up to batch rows processed more than retention ago
// and returns how many. The retention must cover the stream's MaxAge: an
// event the stream can still redeliver must still be remembered. Safe to run
// from several processes at once.
func DeleteExpired(ctx context.Context, q Execer, retention time.Duration, batch int) (int64, error) {
	tag, err := q.Exec(ctx, sqlDeleteExpired, retention, batch)
	return db.Affected("inbox cleanup", tag, err)
}
