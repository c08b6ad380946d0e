package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Pending is a committed, unpublished event as the relay claims it.
type Pending struct {
	Seq         int64
	ID          uuid.UUID
	Tenant      string
	Type        string
	Payload     []byte
	Traceparent string
	CreatedAt   time.Time
	// Attempts counts claims, this one included.
	Attempts int
}

// Querier runs statements: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

const (
	// Claim the oldest claimable events — committed, unpublished, not
	// parked, not leased — that are the oldest unpublished event of their
	// note: only one event per note is ever in flight, so a note's events
	// reach the stream in commit order. No "seq > last seen" cursor: an
	// event whose transaction commits late is found by the same query. A
	// parked event holds back the later events of its own note, no others.
	sqlClaim = `UPDATE outbox_events e
	SET claimed_until = now() + $1::interval, claimed_by = $2, attempts = e.attempts + 1
	FROM (
		SELECT c.seq FROM outbox_events c
		WHERE c.published_at IS NULL AND c.parked_at IS NULL
		  AND (c.claimed_until IS NULL OR c.claimed_until < now())
		  AND NOT EXISTS (
			SELECT 1 FROM outbox_events p
			WHERE p.aggregate_id = c.aggregate_id AND p.published_at IS NULL AND p.seq < c.seq)
		ORDER BY c.seq
		LIMIT $3
		FOR UPDATE SKIP LOCKED
	) pick
	WHERE e.seq = pick.seq
	RETURNING e.seq, e.id, e.tenant, e.type, e.payload, coalesce(e.traceparent, ''), e.created_at, e.attempts`

	sqlMarkPublished = `UPDATE outbox_events e
	SET published_at = now(), stream_seq = u.stream_seq, claimed_until = NULL, last_error = NULL
	FROM unnest($1::bigint[], $2::bigint[]) AS u(seq, stream_seq)
	WHERE e.seq = u.seq AND e.published_at IS NULL`

	sqlRelease = `UPDATE outbox_events SET claimed_until = NULL, last_error = $2
	WHERE seq = ANY($1::bigint[]) AND published_at IS NULL`

	sqlPark = `UPDATE outbox_events SET parked_at = now(), parked_reason = $2, claimed_until = NULL, last_error = $2
	WHERE seq = $1 AND published_at IS NULL`

	sqlParkedList = `SELECT id, tenant, type, aggregate_id, created_at, parked_at, parked_reason, attempts
	FROM outbox_events WHERE parked_at IS NOT NULL AND published_at IS NULL ORDER BY seq`

	sqlUnpark = `UPDATE outbox_events SET parked_at = NULL, parked_reason = NULL, claimed_until = NULL
	WHERE id = $1 AND parked_at IS NOT NULL AND published_at IS NULL`

	sqlUnparkAll = `UPDATE outbox_events SET parked_at = NULL, parked_reason = NULL, claimed_until = NULL
	WHERE parked_at IS NOT NULL AND published_at IS NULL`

	sqlBacklog = `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
	FROM outbox_events WHERE published_at IS NULL`

	sqlDeletePublished = `DELETE FROM outbox_events WHERE seq IN (
		SELECT seq FROM outbox_events WHERE published_at < now() - $1::interval
		ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED)`
)

// Claim leases up to limit events to relay for lease and returns them in
// commit order (by seq). A relay that dies leaves them leased until the
// lease ends; then any relay claims them again.
func Claim(ctx context.Context, q Querier, relay string, lease time.Duration, limit int) ([]Pending, error) {
	rows, err := q.Query(ctx, sqlClaim, lease, relay, limit)
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pending, error) {
		var p Pending
		err := row.Scan(&p.Seq, &p.ID, &p.Tenant, &p.Type, &p.Payload, &p.Traceparent, &p.CreatedAt, &p.Attempts)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	// UPDATE ... RETURNING does not keep the subquery's order.
	slices.SortFunc(events, func(a, b Pending) int { return cmp.Compare(a.Seq, b.Seq) })
	return events, nil
}

// Published is one event the stream acknowledged.
type Published struct {
	Seq       int64
	StreamSeq uint64
}

// MarkPublished records the stream's acknowledgements. Marking an event
// that is already published changes nothing.
func MarkPublished(ctx context.Context, q Querier, acks []Published) error {
	if len(acks) == 0 {
		return nil
	}
	seqs := make([]int64, len(acks))
	streamSeqs := make([]int64, len(acks))
	for i, a := range acks {
		seqs[i], streamSeqs[i] = a.Seq, int64(a.StreamSeq)
	}
	if _, err := q.Exec(ctx, sqlMarkPublished, seqs, streamSeqs); err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	return nil
}

// Release ends the lease of events that could not be published for a
// transient reason, recording it; they are claimed again by the next pass.
func Release(ctx context.Context, q Querier, seqs []int64, reason string) error {
	if len(seqs) == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, sqlRelease, seqs, reason); err != nil {
		return fmt.Errorf("release events: %w", err)
	}
	return nil
}

// Park sets an event aside with the reason it can never be published as it
// is; later events of its note wait behind it, other notes' do not.
func Park(ctx context.Context, q Querier, seq int64, reason string) error {
	if _, err := q.Exec(ctx, sqlPark, seq, reason); err != nil {
		return fmt.Errorf("park event: %w", err)
	}
	return nil
}

// ParkedEvent is a parked event as an operator lists it.
type ParkedEvent struct {
	ID        uuid.UUID `json:"id"`
	Tenant    string    `json:"tenant"`
	Type      string    `json:"type"`
	NoteID    uuid.UUID `json:"note_id"`
	CreatedAt time.Time `json:"created_at"`
	ParkedAt  time.Time `json:"parked_at"`
	Reason    string    `json:"reason"`
	Attempts  int       `json:"attempts"`
}

// ListParked returns every parked event, oldest first.
func ListParked(ctx context.Context, q Querier) ([]ParkedEvent, error) {
	rows, err := q.Query(ctx, sqlParkedList)
	if err != nil {
		return nil, fmt.Errorf("list parked events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ParkedEvent, error) {
		var p ParkedEvent
		err := row.Scan(&p.ID, &p.Tenant, &p.Type, &p.NoteID, &p.CreatedAt, &p.ParkedAt, &p.Reason, &p.Attempts)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list parked events: %w", err)
	}
	return out, nil
}

// ErrNotParked is returned by Unpark for an id that is not a parked event.
var ErrNotParked = errors.New("no parked event with this id")

// Unpark returns a parked event to the queue; the relays publish it on
// their next pass. Errors: ErrNotParked.
func Unpark(ctx context.Context, q Querier, id uuid.UUID) error {
	tag, err := q.Exec(ctx, sqlUnpark, pgUUID(id))
	if err != nil {
		return fmt.Errorf("retry parked event: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", ErrNotParked, id)
	}
	return nil
}

// UnparkAll returns every parked event to the queue and says how many.
func UnparkAll(ctx context.Context, q Querier) (int64, error) {
	tag, err := q.Exec(ctx, sqlUnparkAll)
	if err != nil {
		return 0, fmt.Errorf("retry parked events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Backlog returns how many events are unpublished and the age of the
// oldest, in seconds.
func Backlog(ctx context.Context, q Querier) (pending int64, oldestAge float64, err error) {
	if err := q.QueryRow(ctx, sqlBacklog).Scan(&pending, &oldestAge); err != nil {
		return 0, 0, fmt.Errorf("outbox backlog: %w", err)
	}
	return pending, oldestAge, nil
}

// DeletePublished deletes up to batch events published more than retention
// ago and returns how many. Safe to run from several relays at once.
func DeletePublished(ctx context.Context, q Querier, retention time.Duration, batch int) (int64, error) {
	tag, err := q.Exec(ctx, sqlDeletePublished, retention, batch)
	if err != nil {
		return 0, fmt.Errorf("delete published events: %w", err)
	}
	return tag.RowsAffected(), nil
}
