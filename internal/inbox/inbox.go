// Package inbox deduplicates consumed events: a consumer records each event
// id in the same transaction as the effect of processing it, so a redelivered
// event — after a crash before the acknowledgement, or republished beyond the
// stream's duplicate window — is recognised and has no second effect.
package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Execer runs a statement: a transaction, normally.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

const (
	sqlInsert = `INSERT INTO inbox (consumer, event_id, processed_at) VALUES ($1, $2, $3)
	ON CONFLICT (consumer, event_id) DO NOTHING`

	sqlDeleteExpired = `DELETE FROM inbox WHERE (consumer, event_id) IN (
		SELECT consumer, event_id FROM inbox WHERE processed_at < now() - $1::interval
		ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED)`
)

// Insert records that consumer processed eventID, inside tx — the
// transaction that writes the processing's effect. It reports false when the
// event was recorded before: a duplicate, whose effect must be skipped (and
// whose message acknowledged). A concurrent insert of the same id waits for
// the other transaction and then reports its outcome.
func Insert(ctx context.Context, tx Execer, consumer string, eventID uuid.UUID, now time.Time) (bool, error) {
	tag, err := tx.Exec(ctx, sqlInsert, consumer, pgtype.UUID{Bytes: eventID, Valid: true}, now)
	if err != nil {
		return false, fmt.Errorf("inbox insert: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// DeleteExpired deletes up to batch rows processed more than retention ago
// and returns how many. The retention must cover the stream's MaxAge: an
// event the stream can still redeliver must still be remembered. Safe to run
// from several processes at once.
func DeleteExpired(ctx context.Context, q Execer, retention time.Duration, batch int) (int64, error) {
	tag, err := q.Exec(ctx, sqlDeleteExpired, retention, batch)
	if err != nil {
		return 0, fmt.Errorf("inbox cleanup: %w", err)
	}
	return tag.RowsAffected(), nil
}
