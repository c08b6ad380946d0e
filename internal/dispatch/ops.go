package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Delivery is a delivery row as the operator commands list it.
type Delivery struct {
	ID          int64      `json:"id"`
	Tenant      string     `json:"tenant"`
	EndpointID  string     `json:"endpoint_id"`
	EventID     string     `json:"event_id"`
	EventType   string     `json:"event_type"`
	State       string     `json:"state"`
	Attempts    int        `json:"attempts"`
	LastStatus  *int       `json:"last_status"`
	LastError   *string    `json:"last_error"`
	NextAttempt time.Time  `json:"next_attempt_at"`
	CreatedAt   time.Time  `json:"created_at"`
	DeliveredAt *time.Time `json:"delivered_at"`
	FailedAt    *time.Time `json:"failed_at"`
}

// Query selects the deliveries List returns; empty fields select all.
type Query struct {
	State, Tenant string
	Endpoint      *uuid.UUID
	// Limit bounds the rows (newest first); 0 means 1000.
	Limit int
}

// List returns the deliveries q selects, newest first.
func List(ctx context.Context, pool *pgxpool.Pool, q Query) ([]Delivery, error) {
	if q.Limit <= 0 {
		q.Limit = 1000
	}
	rows, err := pool.Query(ctx, `SELECT id, tenant, endpoint_id::text, event_id::text, event_type, state, attempts, last_status, last_error,
	next_attempt_at, created_at, delivered_at, failed_at
FROM webhook_deliveries
WHERE ($1 = '' OR state = $1) AND ($2 = '' OR tenant = $2) AND ($3::uuid IS NULL OR endpoint_id = $3)
ORDER BY id DESC LIMIT $4`, q.State, q.Tenant, q.Endpoint, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Delivery])
}

// ErrNotFound is returned for a delivery or endpoint that does not exist.
var ErrNotFound = errors.New("not found")

// RefusedRetryError is why Retry refused a delivery.
type RefusedRetryError struct{ Msg string }

func (e *RefusedRetryError) Error() string { return e.Msg }

// Retry makes the failed delivery id pending again, due now, under the
// same event id, its attempts and retry horizon starting again. It refuses one that is
// not failed, and one whose endpoint is deleted or disabled (a
// *RefusedRetryError saying what to do); it returns an error wrapping
// ErrNotFound for an unknown id.
func Retry(ctx context.Context, pool *pgxpool.Pool, id int64) error {
	var state, endpoint string
	var deleted bool
	var health *string
	err := pool.QueryRow(ctx, `SELECT d.state, d.endpoint_id::text, e.deleted_at IS NOT NULL, h.state
FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = d.endpoint_id
WHERE d.id = $1`, id).Scan(&state, &endpoint, &deleted, &health)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("delivery %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("read delivery %d: %w", id, err)
	}
	switch {
	case deleted:
		return &RefusedRetryError{fmt.Sprintf("delivery %d: endpoint %s is deleted; nothing is sent to a deleted endpoint", id, endpoint)}
	case health != nil && *health == "disabled":
		return &RefusedRetryError{fmt.Sprintf("delivery %d: endpoint %s is disabled; run `webhook-dispatcher endpoints enable %s` first", id, endpoint, endpoint)}
	case state != "failed":
		return &RefusedRetryError{fmt.Sprintf("delivery %d is %s, not failed: nothing to retry", id, state)}
	}
	_, err = pool.Exec(ctx, sqlRetryDelivery+` AND id = $1`, id)
	if err != nil {
		return fmt.Errorf("retry delivery %d: %w", id, err)
	}
	return nil
}

// sqlRetryDelivery makes failed deliveries of sendable endpoints pending
// again, due now; the caller adds the selection.
const sqlRetryDelivery = `UPDATE webhook_deliveries d SET state = 'pending', next_attempt_at = now(), failed_at = NULL,
	lease_until = NULL, first_attempt_at = NULL, attempts = 0
WHERE d.state = 'failed'
	AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id AND e.deleted_at IS NULL)
	AND NOT EXISTS (SELECT 1 FROM webhook_endpoint_health h WHERE h.endpoint_id = d.endpoint_id AND h.state = 'disabled')`

// RetryFailed makes every failed delivery (of endpoint only, unless nil)
// pending again, as Retry does, and returns how many; those of deleted or
// disabled endpoints are left failed and counted in skipped.
func RetryFailed(ctx context.Context, pool *pgxpool.Pool, endpoint *uuid.UUID) (retried, skipped int64, err error) {
	tag, err := pool.Exec(ctx, sqlRetryDelivery+` AND ($1::uuid IS NULL OR d.endpoint_id = $1)`, endpoint)
	if err != nil {
		return 0, 0, fmt.Errorf("retry failed deliveries: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE state = 'failed' AND ($1::uuid IS NULL OR endpoint_id = $1)`,
		endpoint).Scan(&skipped); err != nil {
		return tag.RowsAffected(), 0, fmt.Errorf("count failed deliveries: %w", err)
	}
	return tag.RowsAffected(), skipped, nil
}

// Enable makes a disabled endpoint active again, its failures forgotten,
// and returns its failed deliveries' count (which RetryFailed re-sends).
// It returns an error wrapping ErrNotFound for an unknown endpoint and a
// *RefusedRetryError for a deleted one.
func Enable(ctx context.Context, pool *pgxpool.Pool, endpoint uuid.UUID) (failed int64, err error) {
	var deleted bool
	err = pool.QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM webhook_endpoints WHERE id = $1`, endpoint).Scan(&deleted)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("endpoint %s: %w", endpoint, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("read endpoint %s: %w", endpoint, err)
	}
	if deleted {
		return 0, &RefusedRetryError{fmt.Sprintf("endpoint %s is deleted: it cannot be enabled", endpoint)}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_endpoint_health (endpoint_id) VALUES ($1)
ON CONFLICT (endpoint_id) DO UPDATE SET state = 'active', disabled_at = NULL, disabled_reason = NULL, failures_in_row = 0, failing_since = NULL`,
		endpoint); err != nil {
		return 0, fmt.Errorf("enable endpoint %s: %w", endpoint, err)
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE state = 'failed' AND endpoint_id = $1`, endpoint).Scan(&failed)
	return failed, err
}

// The operator pages (the console's Webhooks page, internal/console) read
// with the functions below; they write only through Retry, RetryFailed and
// Enable, as the commands do.

// Page sizes of ListFailed and ListDisabled.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 1000
)

func pageLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultPageLimit
	case n > MaxPageLimit:
		return MaxPageLimit
	}
	return n
}

// FailedQuery selects a page of failed deliveries for ListFailed.
type FailedQuery struct {
	// Endpoint narrows the page to one endpoint's deliveries; nil: all.
	Endpoint *uuid.UUID
	// Before is the cursor: only deliveries with a smaller id (0: from
	// the newest).
	Before int64
	// Limit bounds the rows: 0 means DefaultPageLimit; past
	// MaxPageLimit, MaxPageLimit.
	Limit int
}

const sqlDeliveryColumns = `id, tenant, endpoint_id::text, event_id::text, event_type, state, attempts, last_status, last_error,
	next_attempt_at, created_at, delivered_at, failed_at`

// ListFailed returns a page of failed deliveries, newest (highest id)
// first, below q.Before; the last row's id is the next page's Before.
// Errors: the database's, wrapped.
func ListFailed(ctx context.Context, pool *pgxpool.Pool, q FailedQuery) ([]Delivery, error) {
	rows, err := pool.Query(ctx, `SELECT `+sqlDeliveryColumns+`
FROM webhook_deliveries
WHERE state = 'failed' AND ($1::bigint = 0 OR id < $1) AND ($2::uuid IS NULL OR endpoint_id = $2)
ORDER BY id DESC LIMIT $3`, q.Before, q.Endpoint, pageLimit(q.Limit))
	if err != nil {
		return nil, fmt.Errorf("list failed deliveries: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Delivery])
	if err != nil {
		return nil, fmt.Errorf("list failed deliveries: %w", err)
	}
	return out, nil
}

// GetDelivery returns the delivery id, in whatever state. Errors: one
// wrapping ErrNotFound for an unknown id; the database's, wrapped.
func GetDelivery(ctx context.Context, pool *pgxpool.Pool, id int64) (Delivery, error) {
	rows, err := pool.Query(ctx, `SELECT `+sqlDeliveryColumns+` FROM webhook_deliveries WHERE id = $1`, id)
	if err != nil {
		return Delivery{}, fmt.Errorf("read delivery %d: %w", id, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Delivery])
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("delivery %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return d, fmt.Errorf("read delivery %d: %w", id, err)
	}
	return d, nil
}

// Endpoint is an endpoint as the operator pages show it: whose it is,
// where it points, and its health as the dispatcher recorded it.
type Endpoint struct {
	ID        uuid.UUID
	Tenant    string
	URL       string
	CreatedAt time.Time
	// DeletedAt is set once the tenant deleted it: nothing is sent to it
	// and it cannot be enabled.
	DeletedAt *time.Time
	// State is active or disabled (active when it was never attempted).
	State          string
	DisabledAt     *time.Time
	DisabledReason *string
	// FailuresInRow counts the failed attempts since its last success;
	// FailingSince is the first of them.
	FailuresInRow int
	FailingSince  *time.Time
	LastAttemptAt *time.Time
	LastStatus    *int
	LastError     *string
	// Failed counts its failed deliveries (what RetryFailed re-sends).
	Failed int64
}

const sqlEndpointColumns = `e.id, e.tenant, e.url, e.created_at, e.deleted_at, COALESCE(h.state, 'active'), h.disabled_at, h.disabled_reason,
	COALESCE(h.failures_in_row, 0), h.failing_since, h.last_attempt_at, h.last_status, h.last_error,
	(SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.state = 'failed')
FROM webhook_endpoints e LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = e.id`

// GetEndpoint returns the endpoint id with its health, deleted or not.
// Errors: one wrapping ErrNotFound for an unknown id; the database's,
// wrapped.
func GetEndpoint(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID) (Endpoint, error) {
	rows, err := pool.Query(ctx, `SELECT `+sqlEndpointColumns+` WHERE e.id = $1`, id)
	if err != nil {
		return Endpoint{}, fmt.Errorf("read endpoint %s: %w", id, err)
	}
	e, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Endpoint])
	if errors.Is(err, pgx.ErrNoRows) {
		return e, fmt.Errorf("endpoint %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return e, fmt.Errorf("read endpoint %s: %w", id, err)
	}
	return e, nil
}

// DisabledQuery selects a page of disabled endpoints for ListDisabled.
type DisabledQuery struct {
	// After is the cursor: only endpoints with a greater id (nil: from
	// the first).
	After *uuid.UUID
	// Limit as in FailedQuery.
	Limit int
}

// ListDisabled returns a page of the disabled endpoints that are not
// deleted (those Enable takes back), in id order after q.After; the last
// row's id is the next page's After. Errors: the database's, wrapped.
func ListDisabled(ctx context.Context, pool *pgxpool.Pool, q DisabledQuery) ([]Endpoint, error) {
	// From the health table: it holds a row only for the endpoints ever
	// attempted, and the disabled ones are among those.
	rows, err := pool.Query(ctx, `SELECT `+sqlEndpointColumns+`
WHERE h.state = 'disabled' AND e.deleted_at IS NULL AND ($1::uuid IS NULL OR e.id > $1)
ORDER BY e.id LIMIT $2`, q.After, pageLimit(q.Limit))
	if err != nil {
		return nil, fmt.Errorf("list disabled endpoints: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Endpoint])
	if err != nil {
		return nil, fmt.Errorf("list disabled endpoints: %w", err)
	}
	return out, nil
}
