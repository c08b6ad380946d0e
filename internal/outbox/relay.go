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
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/quillhq/quill/internal/db"
)

// Pending is a committed, unpublished event as the relay claims it.
type Pending struct {
	Seq     int64
	ID      uuid.UUID
	Tenant  string
	Type    string
	Payload []byte
	// Traceparent and Tracestate are the writer's trace context, "" when
	// none was stored.
	Traceparent string
	Tracestate  string
	CreatedAt   time.Time
	// Attempts counts the attempts recorded before this one (see
	// MarkPublished, Release and Park).
	Attempts int
}

// Querier runs statements: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Session is the connection whose session holds a relay's claims: a
// dedicated pgx.Conn, never a pooled connection shared with other work.
type Session interface {
	Querier
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// A relay's claim on an event is a session-level advisory lock, not a write:
// claiming costs no WAL and no dead row version, and the claim ends exactly
// when the relay lets go of it or its session ends — a relay that crashes
// loses its claims the moment PostgreSQL sees its connection close. The
// lock key is the two-int4 form (a key space of its own, apart from the
// one-bigint locks of idempotency and goose): the outbox table's oid, so
// that schemas sharing a database do not collide, and the event's seq
// folded into 32 bits. Two events 2^32 seqs apart share a key; that can
// only delay one of them, never let two relays hold the same event.

const (
	lockKey = "((cand.seq % 4294967296) - 2147483648)::int4"

	sqlLockSpace = `SELECT ('outbox_events'::regclass::oid::bigint - 2147483648)::int4`

	// Lock the oldest claimable events — queued (committed, unpublished),
	// not parked — that are the oldest queued event of their note and not
	// already held by this session ($3): only one event per note is ever
	// in flight, so a note's events reach the stream in commit order. No
	// "seq > last seen" cursor: an event whose transaction commits late is
	// found by the same query. A parked event holds back the later events
	// of its own note, no others.
	//
	// The lock is tried in the outer query, above the ordered subquery
	// (OFFSET 0 keeps the planner from merging the two, and a volatile
	// condition is never pushed down), so rows come up in seq order and
	// LIMIT stops the scan at the limit-th row kept. CASE tries the lock
	// before "oldest of its note": events other relays hold, most of what a
	// claim steps over, are rejected by the failed try alone, and an event
	// waiting behind another of its note is let go at once, so the
	// statement ends holding exactly the rows returned. "Oldest of its
	// note" is a correlated min(), one index probe, not NOT EXISTS, whose
	// anti-join can be planned as a scan of the whole pending set per
	// candidate. The session's own held events are the oldest queued, so
	// the scan meets them first: they are excluded through a multirange
	// built once per statement (a binary search per row, not <> ALL's
	// linear one) — and must be, as an advisory lock is re-entrant.
	sqlClaimLock = `SELECT l.seq, coalesce(e.live, false), e.id, e.tenant, e.type, e.payload, e.traceparent, e.tracestate, e.created_at, e.attempts
	FROM (SELECT cand.seq FROM (
		SELECT c.seq, c.aggregate_id FROM outbox_pending c
		WHERE NOT c.parked
		  AND NOT coalesce((SELECT range_agg(int8range(h, h, '[]')) FROM unnest($3::bigint[]) h) @> c.seq, false)
		ORDER BY c.seq
		OFFSET 0
	) cand
	WHERE CASE WHEN pg_try_advisory_lock($1::int4, ` + lockKey + `)
		THEN CASE WHEN cand.seq = (SELECT min(p.seq) FROM outbox_pending p WHERE p.aggregate_id = cand.aggregate_id)
			THEN true ELSE NOT pg_advisory_unlock($1::int4, ` + lockKey + `) END
		ELSE false END
	LIMIT $2) l
	LEFT JOIN LATERAL (
		SELECT e.published_at IS NULL AND e.parked_at IS NULL AS live, e.id, e.tenant, e.type, e.payload,
			coalesce(e.traceparent, '') AS traceparent, coalesce(e.tracestate, '') AS tracestate, e.created_at, e.attempts
		FROM outbox_events e WHERE e.seq = l.seq
		OFFSET 0
	) e ON true`

	// The locked events that are still queued and not parked, in a new
	// snapshot, taken after the locks: an event another relay published and
	// let go of between the claim's snapshot and its lock is gone from the
	// queue here (its payload, read by the claim, never changes).
	sqlStillQueued = `SELECT seq FROM outbox_pending WHERE seq = ANY($1::bigint[]) AND NOT parked`

	// A queue row whose event is published or gone: the triggers of
	// migration 00007 never leave one, but a write with triggers disabled
	// (session_replication_role = replica) could, and it would be claimed
	// and dropped again on every pass. The claimer holds its lock.
	sqlDropStale = `DELETE FROM outbox_pending p WHERE p.seq = ANY($1::bigint[])
	  AND NOT EXISTS (SELECT 1 FROM outbox_events e WHERE e.seq = p.seq AND e.published_at IS NULL)`

	sqlUnlock = `SELECT count(*) FILTER (WHERE pg_advisory_unlock($1::int4, ` + "((s % 4294967296) - 2147483648)::int4" + `))
	FROM unnest($2::bigint[]) AS s`

	// One update per event, the only write a published event costs the
	// relay: no indexed column changes, so it is a HOT update when the page
	// has room, and the queue row goes with it (trigger of migration
	// 00007). attempts counts recorded attempts: this one.
	sqlMarkPublished = `UPDATE outbox_events e
	SET published_at = now(), stream_seq = u.stream_seq, ack_duplicate = u.duplicate,
		attempts = e.attempts + 1, claimed_by = $4, last_error = NULL
	FROM unnest($1::bigint[], $2::bigint[], $3::boolean[]) AS u(seq, stream_seq, duplicate)
	WHERE e.seq = u.seq AND e.published_at IS NULL`

	sqlRelease = `UPDATE outbox_events SET attempts = attempts + 1, last_error = $2
	WHERE seq = ANY($1::bigint[]) AND published_at IS NULL`

	sqlPark = `UPDATE outbox_events SET parked_at = now(), parked_reason = $2, attempts = attempts + 1, last_error = $2
	WHERE seq = $1 AND published_at IS NULL`

	sqlParkedList = `SELECT id, tenant, type, aggregate_id, created_at, parked_at, parked_reason, attempts
	FROM outbox_events WHERE parked_at IS NOT NULL AND published_at IS NULL ORDER BY seq`

	// Unparking is an update, so the queue's trigger sets the queue row's
	// parked flag — or writes the row, for an unpublished event that lost
	// it (see KindUnqueued in internal/audit): retry queues it again.
	sqlUnpark = `UPDATE outbox_events e SET parked_at = NULL, parked_reason = NULL
	WHERE id = $1 AND published_at IS NULL
	  AND (parked_at IS NOT NULL OR NOT EXISTS (SELECT 1 FROM outbox_pending q WHERE q.seq = e.seq))`

	sqlUnparkAll = `UPDATE outbox_events e SET parked_at = NULL, parked_reason = NULL
	WHERE published_at IS NULL
	  AND (parked_at IS NOT NULL OR NOT EXISTS (SELECT 1 FROM outbox_pending q WHERE q.seq = e.seq))`

	// The age is the oldest queued event's by commit order (the lowest
	// seq): one probe, where min(created_at) would read every pending row.
	// The parked ones are counted in the same pass over the queue.
	sqlBacklog = `SELECT count(*), count(*) FILTER (WHERE parked),
		coalesce((SELECT extract(epoch FROM now() - e.created_at) FROM outbox_events e
			WHERE e.seq = (SELECT min(seq) FROM outbox_pending)), 0)::float8
	FROM outbox_pending`

	// One window of the outbox's oldest events by seq (the primary key;
	// published_at has no index, so that the mark stays HOT): delete those
	// published before the cutoff and say how far the window reached and
	// how many of its events were created before the cutoff. Events are
	// created in about seq order (created_at is the writing transaction's
	// start), so a window with no old event means the rest are younger
	// still; old events that stay — unpublished, parked — are stepped over
	// by the next window rather than stopping the walk.
	sqlDeletePublished = `WITH head AS (
		SELECT seq, created_at, published_at FROM outbox_events WHERE seq > $1 ORDER BY seq LIMIT $2
	), del AS (
		DELETE FROM outbox_events e USING head h
		WHERE e.seq = h.seq AND h.published_at < coalesce($3, now()) - $4::interval AND e.published_at < coalesce($3, now()) - $4::interval
		RETURNING e.seq
	)
	SELECT (SELECT count(*) FROM del), coalesce((SELECT max(seq) FROM head), 0),
		(SELECT count(*) FROM head WHERE created_at < coalesce($3, now()) - $4::interval)`
)

// SessionParams returns the run-time parameters a claim session must be
// opened with. The claim's plan must walk the queue in seq order by its
// primary key and stop at the limit, whatever the statistics say:
// PostgreSQL's custom plans for a prepared statement's first five runs
// cost the actual LIMIT and sort the whole queue once it is large, and a
// plan made while the queue is small or empty — the normal state when a
// relay starts — seq-scans and sorts it too, and the session keeps that
// plan when a backlog builds up. A claim session runs only the claim's
// statements, each an index walk or lookup, so: generic plans from the
// first run, and no seq scans or sorts where an index can do.
func SessionParams() map[string]string {
	return map[string]string{
		"plan_cache_mode": "force_generic_plan",
		"enable_seqscan":  "off",
		"enable_sort":     "off",
	}
}

// LockSpace returns the first key of the relay's advisory locks on this
// outbox (the one the session's search_path finds): derived from the
// table's oid, it differs between schemas of one database.
func LockSpace(ctx context.Context, q Querier) (int32, error) {
	var space int32
	if err := q.QueryRow(ctx, sqlLockSpace).Scan(&space); err != nil {
		return 0, fmt.Errorf("outbox lock space: %w", err)
	}
	return space, nil
}

// Claim first releases the claims in unlock (events the caller has marked,
// released or parked), then claims up to limit events for the session s —
// each the oldest unpublished event of its note, none of those in held
// (the events the session holds already: an advisory lock is re-entrant
// within its session) — and returns them in commit order (by seq). A claim
// is a session-level advisory lock; it lasts until Unlock (or the next
// Claim's unlock) or until the session ends, so a relay that dies loses its
// claims at once and another relay takes the events over. An event another
// relay published between the claim's snapshot and its lock is let go (the
// queue is checked again in a fresh snapshot). Claim writes nothing, except
// to drop a queue row whose event is published or gone (see sqlDropStale).
// On an error the session may hold claims the caller does not know of:
// close it.
func Claim(ctx context.Context, s Session, space int32, unlock, held []int64, limit int) ([]Pending, error) {
	var b pgx.Batch
	if len(unlock) > 0 {
		b.Queue(sqlUnlock, space, unlock)
	}
	var claimed []Pending
	var stale []int64 // locked, but the event is published or gone
	b.Queue(sqlClaimLock, space, limit, nonNil(held)).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var p Pending
			var live bool
			var id pgtype.UUID
			var tenant, typ, traceparent, tracestate pgtype.Text
			var created pgtype.Timestamptz
			var attempts pgtype.Int4
			if err := rows.Scan(&p.Seq, &live, &id, &tenant, &typ, &p.Payload, &traceparent, &tracestate, &created, &attempts); err != nil {
				return err
			}
			if !live {
				stale = append(stale, p.Seq)
				continue
			}
			p.ID, p.Tenant, p.Type, p.Traceparent, p.Tracestate = id.Bytes, tenant.String, typ.String, traceparent.String, tracestate.String
			p.CreatedAt, p.Attempts = created.Time, int(attempts.Int32)
			claimed = append(claimed, p)
		}
		return rows.Err()
	})
	if err := s.SendBatch(ctx, &b).Close(); err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	if len(stale) > 0 {
		if _, err := s.Exec(ctx, sqlDropStale, stale); err != nil {
			return nil, fmt.Errorf("claim events: %w", err)
		}
		if err := Unlock(ctx, s, space, stale); err != nil {
			return nil, err
		}
	}
	if len(claimed) == 0 {
		return nil, nil
	}
	// The plan yields them in seq order; the caller relies on it.
	slices.SortFunc(claimed, func(a, b Pending) int { return cmp.Compare(a.Seq, b.Seq) })
	seqs := make([]int64, len(claimed))
	for i, p := range claimed {
		seqs[i] = p.Seq
	}
	rows, err := s.Query(ctx, sqlStillQueued, seqs)
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	queued, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("claim events: %w", err)
	}
	if len(queued) == len(claimed) {
		return claimed, nil
	}
	// Published or parked since the claim's snapshot: let go.
	still := make(map[int64]bool, len(queued))
	for _, seq := range queued {
		still[seq] = true
	}
	events := claimed[:0]
	var gone []int64
	for _, p := range claimed {
		if still[p.Seq] {
			events = append(events, p)
		} else {
			gone = append(gone, p.Seq)
		}
	}
	if err := Unlock(ctx, s, space, gone); err != nil {
		return nil, err
	}
	return events, nil
}

// Unlock releases the session's claims on seqs.
func Unlock(ctx context.Context, s Querier, space int32, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	var n int
	if err := s.QueryRow(ctx, sqlUnlock, space, seqs).Scan(&n); err != nil {
		return fmt.Errorf("unlock events: %w", err)
	}
	return nil
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// Published is one event the stream acknowledged.
type Published struct {
	Seq       int64
	StreamSeq uint64
	// Duplicate: the stream acknowledged the event as a duplicate of a
	// message it already held (a republish after a crash or a lost mark);
	// StreamSeq is then that message's.
	Duplicate bool
}

// MarkPublished records the stream's acknowledgements — published_at,
// stream_seq, ack_duplicate — and counts the attempt, naming relay in
// claimed_by. Marking an event that is already published changes nothing.
func MarkPublished(ctx context.Context, q Querier, relay string, acks []Published) error {
	if len(acks) == 0 {
		return nil
	}
	seqs := make([]int64, len(acks))
	streamSeqs := make([]int64, len(acks))
	dups := make([]bool, len(acks))
	for i, a := range acks {
		seqs[i], streamSeqs[i], dups[i] = a.Seq, int64(a.StreamSeq), a.Duplicate
	}
	if _, err := q.Exec(ctx, sqlMarkPublished, seqs, streamSeqs, dups, relay); err != nil {
		return fmt.Errorf("mark published: %w", err)
	}
	return nil
}

// Release records a failed attempt — attempts and last_error — for events
// that could not be published for a transient reason. The caller then ends
// their claims (Unlock); the next pass claims them again.
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
// is, counting the failed attempt; later events of its note wait behind it,
// other notes' do not.
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

// ErrNotParked is returned by Unpark for an id that is not a parked event
// (nor an unpublished one missing from the queue).
var ErrNotParked = errors.New("no parked event with this id (nor an unpublished one missing from the queue)")

// Unpark returns a parked event to the queue — or queues again an
// unpublished event whose queue row is missing; the relays publish it on
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

// UnparkAll returns every parked event to the queue, queues again every
// unpublished event missing from it, and says how many. It reads the whole
// outbox: an operator's command, not a relay's.
func UnparkAll(ctx context.Context, q Querier) (int64, error) {
	tag, err := q.Exec(ctx, sqlUnparkAll)
	if err != nil {
		return 0, fmt.Errorf("retry parked events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// BacklogStats is the outbox's backlog at one moment.
type BacklogStats struct {
	// Pending is the number of unpublished events, parked ones included.
	Pending int64
	// Parked is the number of parked events.
	Parked int64
	// OldestAge is the age of the oldest unpublished event, in seconds; 0
	// when there is none.
	OldestAge float64
}

// Backlog returns how many events are unpublished, how many of them are
// parked, and the age of the oldest.
func Backlog(ctx context.Context, q Querier) (BacklogStats, error) {
	var b BacklogStats
	if err := q.QueryRow(ctx, sqlBacklog).Scan(&b.Pending, &b.Parked, &b.OldestAge); err != nil {
		return BacklogStats{}, fmt.Errorf("outbox backlog: %w", err)
	}
	return b, nil
}

// DeletePublished deletes the events published before asOf − retention —
// the zero asOf is the database's clock, which the retention service uses
// (db.AsOf) —, walking the outbox from its oldest event in windows of batch
// events (one short statement each), and returns how many it deleted. Safe
// to run from several relays at once: a row another relay is deleting is
// waited for, then skipped.
func DeletePublished(ctx context.Context, q Querier, asOf time.Time, retention time.Duration, batch int) (int64, error) {
	var total, after int64
	for {
		var deleted, last, old int64
		if err := q.QueryRow(ctx, sqlDeletePublished, after, batch, db.AsOf(asOf), retention).Scan(&deleted, &last, &old); err != nil {
			return total, fmt.Errorf("delete published events: %w", err)
		}
		total += deleted
		if old == 0 || last == 0 || ctx.Err() != nil {
			return total, nil
		}
		after = last
	}
}
