package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The dispatcher's statements. Every time they record is the database's
// clock (now()), so that several dispatchers agree on leases and horizons;
// the durations come in as parameters.
const (
	// sqlInsertDeliveries records the deliveries of a batch of events
	// (arrays by event, in the batch's order): one per live endpoint of the
	// event's tenant subscribed to its type, not disabled, and created
	// before the event (a dispatcher deployed late, or catching up, sends
	// an endpoint nothing of the time before it). One statement for the
	// whole batch: one per event made a transaction of 64 events 64 round
	// trips (decision 0089). It returns the events that got a delivery.
	sqlInsertDeliveries = `INSERT INTO webhook_deliveries
	(tenant, endpoint_id, event_id, event_type, aggregate_id, aggregate_version, payload, event_time)
SELECT e.tenant, e.id, v.event_id, v.event_type, v.aggregate_id, v.aggregate_version, v.payload, v.event_time
FROM unnest($1::text[], $2::uuid[], $3::text[], $4::uuid[], $5::bigint[], $6::bytea[], $7::timestamptz[]) WITH ORDINALITY
	AS v (tenant, event_id, event_type, aggregate_id, aggregate_version, payload, event_time, ord)
JOIN webhook_endpoints e ON e.tenant = v.tenant AND e.deleted_at IS NULL AND v.event_type = ANY (e.event_types)
	AND e.created_at <= v.event_time
LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = e.id
WHERE h.state IS DISTINCT FROM 'disabled'
ORDER BY v.ord, e.id
ON CONFLICT (endpoint_id, event_id) DO NOTHING
RETURNING event_id`

	// sqlClaim leases up to $2 due deliveries for $1 seconds: pending, due,
	// not leased (or the lease ran out), of a live endpoint that is not
	// disabled nor among $3 (this process's endpoints at their
	// concurrency), and with no pending delivery of an earlier version of
	// the same note to the same endpoint (version order).
	//
	// It walks webhook_deliveries_due_order in its order and stops at the
	// LIMIT: the endpoint and version conditions are per-row subqueries
	// (SubPlans the planner cannot turn into joins), so nothing makes it
	// read every pending row and sort them (decision 0089: it did, ~57 ms
	// for 3,000 pending rows, whatever the LIMIT).
	sqlClaim = `UPDATE webhook_deliveries d
SET lease_until = now() + make_interval(secs => $1), attempts = d.attempts + 1,
	first_attempt_at = COALESCE(d.first_attempt_at, now())
FROM webhook_endpoints e
WHERE e.id = d.endpoint_id AND d.id IN (
	SELECT c.id FROM webhook_deliveries c
	WHERE c.state = 'pending' AND c.next_attempt_at <= now()
		AND (c.lease_until IS NULL OR c.lease_until < now())
		AND c.endpoint_id <> ALL ($3::uuid[])
		AND (SELECT ce.deleted_at IS NULL AND h.state IS DISTINCT FROM 'disabled'
			FROM webhook_endpoints ce LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = ce.id
			WHERE ce.id = c.endpoint_id)
		AND (c.aggregate_version IS NULL OR NOT EXISTS (
			SELECT 1 FROM webhook_deliveries p
			WHERE p.endpoint_id = c.endpoint_id AND p.aggregate_id = c.aggregate_id
				AND p.state = 'pending' AND p.aggregate_version < c.aggregate_version))
	ORDER BY c.next_attempt_at, c.id
	LIMIT $2
	FOR UPDATE OF c SKIP LOCKED)
RETURNING d.id, d.tenant, d.endpoint_id, d.event_id, d.payload, d.event_time, d.attempts,
	e.url, e.secret_sealed, CASE WHEN e.previous_secret_until > now() THEN e.previous_secret_sealed END`

	// sqlClaimFor is sqlClaim for endpoints this process is sending to:
	// up to $3[i] deliveries of endpoint $2[i] (its room under
	// QUILL_WEBHOOK_ENDPOINT_CONCURRENCY), each endpoint's due rows in
	// order through webhook_deliveries_endpoint_due. sqlClaim asked for
	// every free slot and took them from one busy endpoint as well as any:
	// the rows past its room were given back at once, two writes of ~60
	// rows per delivery sent (decision 0089).
	sqlClaimFor = `UPDATE webhook_deliveries d
SET lease_until = now() + make_interval(secs => $1), attempts = d.attempts + 1,
	first_attempt_at = COALESCE(d.first_attempt_at, now())
FROM webhook_endpoints e
WHERE e.id = d.endpoint_id AND d.id IN (
	SELECT x.id FROM unnest($2::uuid[], $3::int[]) AS r (endpoint_id, room)
	CROSS JOIN LATERAL (
		SELECT c.id FROM webhook_deliveries c
		WHERE c.endpoint_id = r.endpoint_id AND c.state = 'pending' AND c.next_attempt_at <= now()
			AND (c.lease_until IS NULL OR c.lease_until < now())
			AND (SELECT ce.deleted_at IS NULL AND h.state IS DISTINCT FROM 'disabled'
				FROM webhook_endpoints ce LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = ce.id
				WHERE ce.id = c.endpoint_id)
			AND (c.aggregate_version IS NULL OR NOT EXISTS (
				SELECT 1 FROM webhook_deliveries p
				WHERE p.endpoint_id = c.endpoint_id AND p.aggregate_id = c.aggregate_id
					AND p.state = 'pending' AND p.aggregate_version < c.aggregate_version))
		ORDER BY c.next_attempt_at, c.id
		LIMIT r.room
		FOR UPDATE OF c SKIP LOCKED) x)
RETURNING d.id, d.tenant, d.endpoint_id, d.event_id, d.payload, d.event_time, d.attempts,
	e.url, e.secret_sealed, CASE WHEN e.previous_secret_until > now() THEN e.previous_secret_sealed END`

	// sqlRelease gives back claimed deliveries this process has no room
	// for, as if never claimed.
	sqlRelease = `UPDATE webhook_deliveries d SET lease_until = NULL, attempts = d.attempts - 1,
	first_attempt_at = CASE WHEN d.attempts = 1 THEN NULL ELSE d.first_attempt_at END
FROM unnest($1::bigint[], $2::int[]) AS r (id, attempts)
WHERE d.id = r.id AND d.attempts = r.attempts AND d.state = 'pending'`

	// sqlDelivered marks deliveries delivered, whoever's claim each is now
	// (a 2xx is a fact), and records the success on each endpoint's
	// health once, in one statement: the marker's batch ($1 ids, $2
	// statuses, $3 endpoints, by delivery). One health write per endpoint
	// per batch, in endpoint order: a row per mark made every mark to one
	// endpoint wait for the previous one's commit (decision 0089).
	sqlDelivered = `WITH m AS (
	SELECT * FROM unnest($1::bigint[], $2::int[], $3::uuid[]) AS m (id, status, endpoint_id)
), d AS (
	UPDATE webhook_deliveries w SET state = 'delivered', delivered_at = now(), lease_until = NULL,
		last_status = m.status, last_error = NULL
	FROM m WHERE w.id = m.id AND w.state = 'pending'
), e AS (
	SELECT DISTINCT ON (endpoint_id) endpoint_id, status FROM m ORDER BY endpoint_id, id DESC
)
INSERT INTO webhook_endpoint_health AS h
	(endpoint_id, last_attempt_at, last_delivery_at, last_status, last_error, failures_in_row, failing_since)
SELECT e.endpoint_id, now(), now(), e.status, NULL, 0, NULL FROM e ORDER BY e.endpoint_id
ON CONFLICT (endpoint_id) DO UPDATE SET last_attempt_at = now(), last_delivery_at = now(),
	last_status = excluded.last_status, last_error = NULL, failures_in_row = 0, failing_since = NULL`

	// sqlRetry schedules the next attempt after $3 seconds, or fails the
	// delivery once $4 seconds have passed since its first attempt. It
	// applies only while the claim is still this attempt's ($5, the
	// attempts it made): a process whose lease ran out and was claimed
	// again does not overrule the newer attempt.
	sqlRetry = `UPDATE webhook_deliveries SET lease_until = NULL, last_status = $2, last_error = $6,
	state = CASE WHEN first_attempt_at + make_interval(secs => $4) <= now() THEN 'failed' ELSE 'pending' END,
	failed_at = CASE WHEN first_attempt_at + make_interval(secs => $4) <= now() THEN now() END,
	next_attempt_at = now() + make_interval(secs => $3)
WHERE id = $1 AND state = 'pending' AND attempts = $5
RETURNING state`

	// sqlFail fails a delivery at once (a 410), under the same rule as
	// sqlRetry.
	sqlFail = `UPDATE webhook_deliveries SET state = 'failed', failed_at = now(), lease_until = NULL,
	last_status = $2, last_error = $3
WHERE id = $1 AND state = 'pending' AND attempts = $4`

	// sqlHealthFailure records a failed attempt on the endpoint's health
	// and disables the endpoint when it has been failing since at least $4
	// seconds ago.
	sqlHealthFailure = `INSERT INTO webhook_endpoint_health AS h
	(endpoint_id, last_attempt_at, last_status, last_error, failures_in_row, failing_since)
VALUES ($1, now(), $2, $3, 1, now())
ON CONFLICT (endpoint_id) DO UPDATE SET last_attempt_at = now(), last_status = $2, last_error = $3,
	failures_in_row = h.failures_in_row + 1, failing_since = COALESCE(h.failing_since, now()),
	state = CASE WHEN h.state = 'active' AND COALESCE(h.failing_since, now()) > now() - make_interval(secs => $4)
		THEN 'active' ELSE 'disabled' END,
	disabled_at = CASE WHEN h.state = 'disabled' THEN h.disabled_at
		WHEN COALESCE(h.failing_since, now()) > now() - make_interval(secs => $4) THEN NULL ELSE now() END,
	disabled_reason = CASE WHEN h.state = 'disabled' THEN h.disabled_reason
		WHEN COALESCE(h.failing_since, now()) > now() - make_interval(secs => $4) THEN NULL
		ELSE 'failing since ' || to_char(h.failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ', longer than QUILL_WEBHOOK_DISABLE_AFTER' END
RETURNING state`
	// sqlDisable disables an endpoint at once ($2 the reason).
	sqlDisable = `INSERT INTO webhook_endpoint_health AS h
	(endpoint_id, state, disabled_at, disabled_reason, last_attempt_at, last_status, last_error, failures_in_row, failing_since)
VALUES ($1, 'disabled', now(), $2, now(), $3, $2, 1, now())
ON CONFLICT (endpoint_id) DO UPDATE SET state = 'disabled', disabled_at = now(), disabled_reason = $2,
	last_attempt_at = now(), last_status = $3, last_error = $2, failures_in_row = h.failures_in_row + 1,
	failing_since = COALESCE(h.failing_since, now())`

	// sqlFailUnsendable fails the pending deliveries no one will send:
	// those of disabled and of deleted endpoints (decision 0083). They stay
	// listed and can be re-sent once the endpoint is enabled.
	sqlFailUnsendable = `UPDATE webhook_deliveries d SET state = 'failed', failed_at = now(), lease_until = NULL,
	last_error = CASE WHEN e.deleted_at IS NOT NULL THEN 'endpoint deleted'
		ELSE 'endpoint disabled: ' || COALESCE(h.disabled_reason, 'unknown') END
FROM webhook_endpoints e LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = e.id
WHERE e.id = d.endpoint_id AND d.state = 'pending' AND (e.deleted_at IS NOT NULL OR h.state = 'disabled')
	AND ($1::uuid IS NULL OR d.endpoint_id = $1)
	AND (d.lease_until IS NULL OR d.lease_until < now())`

	sqlPending = `SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`
	// sqlEndpoints counts the endpoints not deleted by state; one without
	// a health row (never attempted) is active.
	sqlEndpoints = `SELECT count(*) FILTER (WHERE h.state IS DISTINCT FROM 'disabled'), count(*) FILTER (WHERE h.state = 'disabled')
FROM webhook_endpoints e LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = e.id
WHERE e.deleted_at IS NULL`

	// sqlCleanup deletes up to $2 delivered and failed rows settled more
	// than $1 seconds ago.
	sqlCleanup = `DELETE FROM webhook_deliveries WHERE id IN (
	SELECT id FROM webhook_deliveries
	WHERE state IN ('delivered', 'failed') AND COALESCE(delivered_at, failed_at) < now() - make_interval(secs => $1)
	LIMIT $2)`
)

// secs is d in seconds, for make_interval.
func secs(d time.Duration) float64 { return d.Seconds() }

// claimed is a delivery a claim leased.
type claimed struct {
	id                 int64
	tenant             string
	endpoint           uuid.UUID
	eventID            uuid.UUID
	payload            []byte
	eventTime          time.Time
	attempts           int
	url                string
	sealed, prevSealed []byte
	// leasedAt is when the claim began (this process's clock): the lease
	// runs at least until leasedAt + Config.lease().
	leasedAt time.Time
}

// store runs the dispatcher's statements.
type store struct{ pool *pgxpool.Pool }

func (s store) claim(ctx context.Context, lease time.Duration, n int, busy []uuid.UUID) ([]claimed, error) {
	if busy == nil {
		busy = []uuid.UUID{}
	}
	rows, err := s.pool.Query(ctx, sqlClaim, secs(lease), n, busy)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return collectClaimed(rows)
}

// claimFor claims up to rooms[i] deliveries of endpoints[i].
func (s store) claimFor(ctx context.Context, lease time.Duration, endpoints []uuid.UUID, rooms []int) ([]claimed, error) {
	rows, err := s.pool.Query(ctx, sqlClaimFor, secs(lease), endpoints, rooms)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return collectClaimed(rows)
}

func collectClaimed(rows pgx.Rows) ([]claimed, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var c claimed
		err := r.Scan(&c.id, &c.tenant, &c.endpoint, &c.eventID, &c.payload, &c.eventTime, &c.attempts, &c.url, &c.sealed, &c.prevSealed)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

func (s store) release(ctx context.Context, cs []claimed) error {
	ids, attempts := make([]int64, len(cs)), make([]int, len(cs))
	for i, c := range cs {
		ids[i], attempts[i] = c.id, c.attempts
	}
	_, err := s.pool.Exec(ctx, sqlRelease, ids, attempts)
	return err
}

// delivered marks the deliveries of ms delivered and records the
// successes on their endpoints' health, in one statement.
func (s store) delivered(ctx context.Context, ms []mark) error {
	ids, statuses, endpoints := make([]int64, len(ms)), make([]int, len(ms)), make([]uuid.UUID, len(ms))
	for i, m := range ms {
		ids[i], statuses[i], endpoints[i] = m.id, m.status, m.endpoint
	}
	if _, err := s.pool.Exec(ctx, sqlDelivered, ids, statuses, endpoints); err != nil {
		return fmt.Errorf("mark %d deliveries delivered: %w", len(ms), err)
	}
	return nil
}

// retry schedules c again after wait, or fails it past retryFor, and
// records the failure on the endpoint's health. It returns the delivery's
// state ("" when another claim has taken it over) and whether the endpoint
// is now disabled.
func (s store) retry(ctx context.Context, c claimed, status *int, msg string, wait, retryFor, disableAfter time.Duration) (string, bool, error) {
	var state string
	err := s.pool.QueryRow(ctx, sqlRetry, c.id, status, secs(wait), secs(retryFor), c.attempts, msg).Scan(&state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", false, fmt.Errorf("schedule delivery %d again: %w", c.id, err)
	}
	var health string
	if err := s.pool.QueryRow(ctx, sqlHealthFailure, c.endpoint, status, msg, secs(disableAfter)).Scan(&health); err != nil {
		return state, false, fmt.Errorf("record endpoint %s's health: %w", c.endpoint, err)
	}
	return state, health == "disabled", nil
}

// gone fails c and disables its endpoint at once (a 410 Gone).
func (s store) gone(ctx context.Context, c claimed, status int, reason string) error {
	// The endpoint first: whoever sees the delivery failed sees why.
	if _, err := s.pool.Exec(ctx, sqlDisable, c.endpoint, reason, status); err != nil {
		return fmt.Errorf("disable endpoint %s: %w", c.endpoint, err)
	}
	if _, err := s.pool.Exec(ctx, sqlFail, c.id, status, reason, c.attempts); err != nil {
		return fmt.Errorf("fail delivery %d: %w", c.id, err)
	}
	return nil
}

// failUnsendable fails the pending deliveries of disabled and deleted
// endpoints (of endpoint only, unless it is nil) and returns how many.
func (s store) failUnsendable(ctx context.Context, endpoint *uuid.UUID) (int64, error) {
	tag, err := s.pool.Exec(ctx, sqlFailUnsendable, endpoint)
	if err != nil {
		return 0, fmt.Errorf("fail the deliveries of disabled and deleted endpoints: %w", err)
	}
	return tag.RowsAffected(), nil
}

func (s store) pending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, sqlPending).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending deliveries: %w", err)
	}
	return n, nil
}

// endpoints counts the endpoints not deleted: active and disabled.
func (s store) endpoints(ctx context.Context) (active, disabled int64, err error) {
	if err := s.pool.QueryRow(ctx, sqlEndpoints).Scan(&active, &disabled); err != nil {
		return 0, 0, fmt.Errorf("count webhook endpoints: %w", err)
	}
	return active, disabled, nil
}

// cleanup deletes settled rows older than retention, in batches, and
// returns how many.
func (s store) cleanup(ctx context.Context, retention time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, sqlCleanup, secs(retention), 1000)
		if err != nil {
			return total, fmt.Errorf("delete old deliveries: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

// recordable is one event of a batch for insertDeliveries.
type recordable struct {
	tenant    string
	id        uuid.UUID
	eventType string
	aggregate pgtype.UUID
	version   pgtype.Int8
	payload   []byte
	time      time.Time
}

// insertDeliveries records the deliveries of a batch of events in the
// consumer's transaction and returns the events that got a new one.
func insertDeliveries(ctx context.Context, tx pgx.Tx, evs []recordable) (map[uuid.UUID]bool, error) {
	n := len(evs)
	tenants, ids, types := make([]string, n), make([]uuid.UUID, n), make([]string, n)
	aggs, versions, payloads, times := make([]pgtype.UUID, n), make([]pgtype.Int8, n), make([][]byte, n), make([]time.Time, n)
	for i, e := range evs {
		tenants[i], ids[i], types[i], aggs[i], versions[i], payloads[i], times[i] = e.tenant, e.id, e.eventType, e.aggregate, e.version, e.payload, e.time
	}
	rows, err := tx.Query(ctx, sqlInsertDeliveries, tenants, ids, types, aggs, versions, payloads, times)
	if err != nil {
		return nil, fmt.Errorf("record deliveries of %d events: %w", n, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("record deliveries of %d events: %w", n, err)
	}
	out := make(map[uuid.UUID]bool, len(got))
	for _, id := range got {
		out[id] = true
	}
	return out, nil
}
