package webhooks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/internal/db"
)

// An endpoint's states, as its health row holds them (no row: active).
const (
	StateActive   = "active"
	StateDisabled = "disabled"
)

// Endpoint is a live endpoint as the reads show it: its settings and the
// dispatcher's account of its health. It never holds a secret.
type Endpoint struct {
	ID          uuid.UUID
	URL         string
	EventTypes  []string
	Description string
	CreatedAt   time.Time
	Health      Health
}

// Health is what the dispatcher recorded of an endpoint's deliveries; the
// zero value (no row yet) is active and never attempted.
type Health struct {
	State          string
	DisabledReason *string
	LastAttemptAt  *time.Time
	LastDeliveryAt *time.Time
	LastStatus     *int32
	LastError      *string
	FailuresInRow  int32
	FailingSince   *time.Time
}

// sqlEndpointSelect reads endpoints with their health; no health row reads
// as active and never attempted.
const sqlEndpointSelect = `SELECT e.id, e.url, e.event_types, e.description, e.created_at,
	coalesce(h.state, 'active'), h.disabled_reason, h.last_attempt_at, h.last_delivery_at,
	h.last_status, h.last_error, coalesce(h.failures_in_row, 0), h.failing_since
FROM webhook_endpoints e LEFT JOIN webhook_endpoint_health h ON h.endpoint_id = e.id
WHERE e.tenant = $1 AND e.deleted_at IS NULL`

const (
	sqlEndpointGet  = sqlEndpointSelect + ` AND e.id = $2`
	sqlEndpointList = sqlEndpointSelect + ` ORDER BY e.created_at, e.id LIMIT $2`
)

func scanEndpoint(row pgx.Row) (*Endpoint, error) {
	var e Endpoint
	h := &e.Health
	err := row.Scan(&e.ID, &e.URL, &e.EventTypes, &e.Description, &e.CreatedAt,
		&h.State, &h.DisabledReason, &h.LastAttemptAt, &h.LastDeliveryAt, &h.LastStatus, &h.LastError,
		&h.FailuresInRow, &h.FailingSince)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// Get returns the tenant's live endpoint id. Errors: ErrNotConfigured,
// ErrNotFound, and the database's, translated (db.ErrUnavailable).
func (s *Service) Get(ctx context.Context, tenant string, id uuid.UUID) (*Endpoint, error) {
	if s.keys == nil {
		return nil, ErrNotConfigured
	}
	conn, release, err := s.acquire(ctx, tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := scanEndpoint(conn.QueryRow(ctx, sqlEndpointGet, tenant, pgUUID(id)))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("get webhook endpoint: %w", db.Translate(err))
	}
	return e, nil
}

// List returns the tenant's live endpoints, oldest first: all of them, as
// a tenant has at most MaxEndpoints. Errors as for Get but ErrNotFound.
func (s *Service) List(ctx context.Context, tenant string) ([]*Endpoint, error) {
	if s.keys == nil {
		return nil, ErrNotConfigured
	}
	conn, release, err := s.acquire(ctx, tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	// Bounded even for a tenant past the limit (were it lowered since).
	rows, err := conn.Query(ctx, sqlEndpointList, tenant, MaxEndpoints*4)
	if err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", db.Translate(err))
	}
	defer rows.Close()
	var out []*Endpoint
	for rows.Next() {
		e, err := scanEndpoint(rows)
		if err != nil {
			return nil, fmt.Errorf("list webhook endpoints: %w", db.Translate(err))
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", db.Translate(err))
	}
	return out, nil
}
