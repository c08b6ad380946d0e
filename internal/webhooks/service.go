package webhooks

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/whsecret"
)

// The actions' parameter versions (see notes: a version changes whenever a
// parameter's meaning does).
const (
	createVersion = 1
	deleteVersion = 1
	rotateVersion = 1
)

// RotationOverlap is how long the previous secret keeps signing beside the
// new one after a rotation.
const RotationOverlap = 24 * time.Hour

// Outcomes the writes are recorded with; the API maps each to its status.
const (
	OutcomeCreated = "created"
	OutcomeDeleted = "deleted"
	OutcomeRotated = "rotated"
	// OutcomeLimitReached: a create refused because the tenant has
	// MaxEndpoints live endpoints. Recorded: the key answers it again.
	OutcomeLimitReached = "limit_reached"
	// OutcomeNotFound: a delete or a rotation of an endpoint the tenant
	// has no live one of. Recorded, as a note's delete records it.
	OutcomeNotFound = "not_found"
)

// Errors of the service.
var (
	// ErrNotConfigured: QUILL_WEBHOOK_SECRET_KEY is not set, so no
	// secret can be sealed or opened; every webhook request answers it.
	ErrNotConfigured = errors.New("webhooks are not configured: QUILL_WEBHOOK_SECRET_KEY is not set")
	// ErrNotFound: no live endpoint with the id for the tenant.
	ErrNotFound = errors.New("no such webhook endpoint for this tenant")
	// ErrNoRender: a write request came without its RenderError.
	errNoRender = errors.New("webhooks: the write request has no RenderError")
)

// LimitError is the refusal of a create past MaxEndpoints.
type LimitError struct{ Max int }

func (e *LimitError) Error() string {
	return fmt.Sprintf("the tenant has %d live webhook endpoints, the most it may have", e.Max)
}

// Service performs the webhook endpoints' writes as idempotent operations
// and answers their reads.
type Service struct {
	pool  *pgxpool.Pool
	cfg   idempotency.Config
	keys  *whsecret.Keys
	now   func() time.Time
	obs   idempotency.Observer
	rules Rules
	turn  TurnFunc
	proto *idempotency.Protocol
}

// TurnFunc waits for tenant's turn at the pool, shared with the other
// services on it (notes.Service.Turn, db.Fair), and returns the function
// that gives it back; its error wraps db.ErrPoolTimeout when the wait is
// past the acquire timeout.
type TurnFunc func(ctx context.Context, tenant string) (release func(), err error)

// Option configures a Service.
type Option func(*Service)

// WithClock sets the clock (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// WithObserver sets where the protocol's counts go (default: nowhere).
func WithObserver(o idempotency.Observer) Option { return func(s *Service) { s.obs = o } }

// WithRules sets the validation rules (default: the zero Rules, public
// https endpoints only).
func WithRules(r Rules) Option { return func(s *Service) { s.rules = r } }

// WithTurns makes every read and write wait for the tenant's turn at the
// pool first (default: no turns), so that a tenant flooding the webhook
// routes takes its share of the connections the notes' traffic shares,
// no more.
func WithTurns(turn TurnFunc) Option { return func(s *Service) { s.turn = turn } }

// ValidateCreate checks a create's input under the service's rules
// (Rules.ValidateCreate).
func (s *Service) ValidateCreate(in CreateInput) (CreateParams, error) {
	return s.rules.ValidateCreate(in)
}

type nopObserver struct{}

func (nopObserver) Idempotency(string, string) {}
func (nopObserver) BusinessEffect(string)      {}

// NewService returns a service over pool sealing secrets with keys; nil
// keys is a deployment without QUILL_WEBHOOK_SECRET_KEY, whose every call
// returns ErrNotConfigured. It returns an error when cfg, after defaults,
// is invalid.
func NewService(pool *pgxpool.Pool, cfg idempotency.Config, keys *whsecret.Keys, log zerolog.Logger, opts ...Option) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhooks config: %w", err)
	}
	s := &Service{pool: pool, cfg: cfg, keys: keys, now: time.Now, obs: nopObserver{},
		turn: func(context.Context, string) (func(), error) { return func() {}, nil }}
	for _, o := range opts {
		o(s)
	}
	s.proto = idempotency.NewProtocol(pool, cfg, log, s.now, s.obs, gate{s})
	return s, nil
}

// RunReplayCounter writes the replay counts of the webhook writes every
// ReplayFlushInterval until ctx ends, and once more then
// (idempotency.Protocol.RunReplayCounter). It returns nil.
func (s *Service) RunReplayCounter(ctx context.Context) error { return s.proto.RunReplayCounter(ctx) }

// Configured reports whether the service has a key to seal secrets with.
func (s *Service) Configured() bool { return s.keys != nil }

// gate hands the protocol pool connections in the tenant's turn, bounded
// by AcquireTimeout.
type gate struct{ s *Service }

func (g gate) Turn(ctx context.Context, tenant string) (func(), error) { return g.s.turn(ctx, tenant) }

func (g gate) Acquire(ctx context.Context, tenant string) (idempotency.Querier, func(), error) {
	c, release, err := g.s.acquire(ctx, tenant)
	if err != nil {
		return nil, nil, err
	}
	return c, release, nil
}

// acquire takes tenant's turn, then a pool connection; the wait for both
// is bounded by AcquireTimeout together. release gives both back.
func (s *Service) acquire(ctx context.Context, tenant string) (*pgxpool.Conn, func(), error) {
	start := time.Now()
	turn, err := s.turn(ctx, tenant)
	if err != nil {
		return nil, nil, err
	}
	timeout := s.cfg.AcquireTimeout
	if timeout > 0 {
		// What the turn took counts against the same wait (at least a
		// millisecond is left, as zero would mean no bound).
		timeout = max(time.Millisecond, timeout-time.Since(start))
	}
	c, err := db.Acquire(ctx, s.pool, timeout)
	if err != nil {
		turn()
		return nil, nil, err
	}
	return c, func() { c.Release(); turn() }, nil
}

// Request identifies one write request: the authenticated tenant, the
// operation key, how long it may wait for a concurrent request with the
// key (negative: the configured default), and how a refusal recorded for
// the operation is rendered (the API's problem document of the error).
type Request struct {
	Tenant      string
	Key         string
	Wait        time.Duration
	RenderError func(error) []byte
}

func (r Request) protocolRequest(fp idempotency.Fingerprint, plan func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error)) idempotency.Request {
	return idempotency.Request{Tenant: r.Tenant, Key: r.Key, Wait: r.Wait, Fingerprint: fp, Plan: plan}
}

// Answer is a write's answer (idempotency.Answer): the body holds the
// secret in the clear for a create or a rotation, opened from the sealed
// form the record keeps.
type Answer = idempotency.Answer

// Created is a create's answer body: the endpoint and its secret, shown
// here only.
type Created struct {
	ID          string   `json:"id"`
	URL         string   `json:"url"`
	EventTypes  []string `json:"event_types"`
	Description string   `json:"description"`
	CreatedAt   string   `json:"created_at"`
	Secret      string   `json:"secret"`
	State       string   `json:"state"`
}

// Rotated is a rotation's answer body.
type Rotated struct {
	ID                      string `json:"id"`
	Secret                  string `json:"secret"`
	PreviousSecretExpiresAt string `json:"previous_secret_expires_at"`
}

// Deleted is a delete's answer body.
type Deleted struct {
	ID        string `json:"id"`
	DeletedAt string `json:"deleted_at"`
}

// FormatTime formats t as the API writes times.
func FormatTime(t time.Time) string { return t.UTC().Format(outbox.TimeFormat) }

// Create creates an endpoint as the operation (r.Tenant, r.Key). Errors:
// ErrNotConfigured, *idempotency.KeyReusedError, *idempotency.ExpiredError,
// idempotency.ErrInProgress, *idempotency.UnavailableError, and others for
// unexpected failures (nothing committed). A refusal past MaxEndpoints is
// an answer with OutcomeLimitReached, recorded.
func (s *Service) Create(ctx context.Context, r Request, p CreateParams) (Answer, error) {
	if err := s.writable(r); err != nil {
		return Answer{}, err
	}
	fp, err := idempotency.NewFingerprint(contract.ActionCreateWebhook, createVersion,
		idempotency.Params{"url": p.URL, "event_types": p.EventTypes, "description": p.Description})
	if err != nil {
		return Answer{}, err
	}
	out, err := s.proto.Run(ctx, r.protocolRequest(fp, func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error) {
		return s.planCreate(ctx, tx, r, p, now)
	}))
	return s.opened(r.Tenant, out, err)
}

// writable says why r cannot be written: ErrNotConfigured without sealing
// keys, errNoRender without a way to render refusals.
func (s *Service) writable(r Request) error {
	if s.keys == nil {
		return ErrNotConfigured
	}
	if r.RenderError == nil {
		return errNoRender
	}
	return nil
}

// Delete deletes endpoint id as the operation (r.Tenant, r.Key): it stays,
// with deleted_at, and nothing is delivered to it any more. An endpoint
// the tenant has no live one of is recorded as OutcomeNotFound. Errors as
// for Create.
func (s *Service) Delete(ctx context.Context, r Request, id uuid.UUID) (Answer, error) {
	if err := s.writable(r); err != nil {
		return Answer{}, err
	}
	fp, err := idempotency.NewFingerprint(contract.ActionDeleteWebhook, deleteVersion, idempotency.Params{"id": id.String()})
	if err != nil {
		return Answer{}, err
	}
	return s.proto.Run(ctx, r.protocolRequest(fp, func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error) {
		return s.planDelete(ctx, tx, r, id, now)
	}))
}

// RotateSecret gives endpoint id a new secret as the operation (r.Tenant,
// r.Key); the one it had keeps signing beside it for RotationOverlap (a
// rotation within that time ends the older one's overlap). Errors as for
// Create; no live endpoint is recorded as OutcomeNotFound.
func (s *Service) RotateSecret(ctx context.Context, r Request, id uuid.UUID) (Answer, error) {
	if err := s.writable(r); err != nil {
		return Answer{}, err
	}
	fp, err := idempotency.NewFingerprint(contract.ActionRotateWebhookSecret, rotateVersion, idempotency.Params{"id": id.String()})
	if err != nil {
		return Answer{}, err
	}
	out, err := s.proto.Run(ctx, r.protocolRequest(fp, func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error) {
		return s.planRotate(ctx, tx, r, id, now)
	}))
	return s.opened(r.Tenant, out, err)
}

// The row a create writes, as this package owns it (see db.Insert).
var endpointInsert = db.Insert{Table: "webhook_endpoints", Columns: []db.Column{
	{Name: "id", Type: "uuid"}, {Name: "tenant", Type: "text"}, {Name: "url", Type: "text"},
	{Name: "event_types", Type: "text[]"}, {Name: "description", Type: "text"},
	{Name: "secret_sealed", Type: "bytea"}, {Name: "operation_key", Type: "text"},
	{Name: "created_at", Type: "timestamptz"},
}}

var (
	createWrite  = idempotency.NewClaimWrite(endpointInsert)
	nothingWrite = idempotency.NewClaimWrite()
)

const (
	// sqlTenantLock serializes a tenant's creates until the COMMIT, so
	// that the count read after it holds: two creates cannot both see 15.
	// Taken before the claim's lock on the operation; that one is only
	// tried, so no two transactions wait on each other.
	sqlTenantLock = `SELECT pg_advisory_xact_lock($1)`

	// sqlLiveCount counts the tenant's live endpoints; its own statement
	// after the lock, so that its snapshot sees every create committed
	// before the lock was granted.
	sqlLiveCount = `SELECT count(*) FROM webhook_endpoints WHERE tenant = $1 AND deleted_at IS NULL`

	// sqlEndpointLock locks the live endpoint a delete or a rotation acts
	// on, before the claim, so that it stays live and its secret holds
	// until the COMMIT.
	sqlEndpointLock = `SELECT secret_sealed FROM webhook_endpoints
	WHERE tenant = $1 AND id = $2 AND deleted_at IS NULL FOR UPDATE`

	// sqlEndpointDelete and sqlEndpointRotate follow the claim, guarded
	// by idempotency.Claimed.
	sqlEndpointDelete = `UPDATE webhook_endpoints SET deleted_at = $3
	WHERE tenant = $1 AND id = $2 AND current_setting($4::text)::boolean`
	sqlEndpointRotate = `UPDATE webhook_endpoints SET secret_sealed = $3,
		previous_secret_sealed = secret_sealed, previous_secret_until = $4
	WHERE tenant = $1 AND id = $2 AND current_setting($5::text)::boolean`
)

// tenantLockKey is the key of the advisory lock that serializes tenant's
// creates: an operation's lock id (idempotency.LockID) of a key no request
// can send (operation keys are printable ASCII), so it never is one.
func tenantLockKey(tenant string) int64 { return idempotency.LockID(tenant, "\x00webhook-endpoints") }

func (s *Service) planCreate(ctx context.Context, tx *db.Pipeline, r Request, p CreateParams, now time.Time) (*idempotency.Plan, error) {
	if _, err := tx.Exec(ctx, sqlTenantLock, tenantLockKey(r.Tenant)); err != nil {
		return nil, fmt.Errorf("lock tenant's endpoints: %w", db.Translate(err))
	}
	var live int
	if err := tx.QueryRow(ctx, sqlLiveCount, r.Tenant).Scan(&live); err != nil {
		return nil, fmt.Errorf("count endpoints: %w", db.Translate(err))
	}
	if live >= MaxEndpoints {
		return &idempotency.Plan{Outcome: OutcomeLimitReached, Body: r.RenderError(&LimitError{Max: MaxEndpoints}),
			Write: nothingWrite}, nil
	}
	id := uuid.New()
	secret, err := whsecret.NewSecret()
	if err != nil {
		return nil, err
	}
	sealed, err := s.keys.Seal(secret, r.Tenant, id.String())
	if err != nil {
		return nil, err
	}
	resource := contract.WebhookPath(id.String())
	body, err := json.Marshal(Created{ID: id.String(), URL: p.URL, EventTypes: p.EventTypes, Description: p.Description,
		CreatedAt: FormatTime(now), Secret: sealedMarker(sealed), State: StateActive})
	if err != nil {
		return nil, fmt.Errorf("render create: %w", err)
	}
	return &idempotency.Plan{Outcome: OutcomeCreated, Body: body, Resource: resource, Effect: true,
		Write: createWrite, Args: [][]any{{pgUUID(id), r.Tenant, p.URL, p.EventTypes, p.Description, sealed, r.Key, now}}}, nil
}

// lockLive locks the tenant's live endpoint id and returns its sealed
// secret; found is false when there is none.
func lockLive(ctx context.Context, tx *db.Pipeline, tenant string, id uuid.UUID) (sealed []byte, found bool, err error) {
	err = tx.QueryRow(ctx, sqlEndpointLock, tenant, pgUUID(id)).Scan(&sealed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("lock endpoint: %w", db.Translate(err))
	}
	return sealed, true, nil
}

func notFound(r Request, resource string) *idempotency.Plan {
	return &idempotency.Plan{Outcome: OutcomeNotFound, Body: r.RenderError(ErrNotFound), Resource: resource, Write: nothingWrite}
}

func (s *Service) planDelete(ctx context.Context, tx *db.Pipeline, r Request, id uuid.UUID, now time.Time) (*idempotency.Plan, error) {
	resource := contract.WebhookPath(id.String())
	switch _, found, err := lockLive(ctx, tx, r.Tenant, id); {
	case err != nil:
		return nil, err
	case !found:
		return notFound(r, resource), nil
	}
	body, err := json.Marshal(Deleted{ID: id.String(), DeletedAt: FormatTime(now)})
	if err != nil {
		return nil, fmt.Errorf("render delete: %w", err)
	}
	return &idempotency.Plan{Outcome: OutcomeDeleted, Body: body, Resource: resource, Effect: true, Write: nothingWrite,
		Then: func(b *pgx.Batch) error {
			b.Queue(sqlEndpointDelete, r.Tenant, pgUUID(id), now, string(idempotency.Claimed))
			return nil
		}}, nil
}

func (s *Service) planRotate(ctx context.Context, tx *db.Pipeline, r Request, id uuid.UUID, now time.Time) (*idempotency.Plan, error) {
	resource := contract.WebhookPath(id.String())
	switch _, found, err := lockLive(ctx, tx, r.Tenant, id); {
	case err != nil:
		return nil, err
	case !found:
		return notFound(r, resource), nil
	}
	secret, err := whsecret.NewSecret()
	if err != nil {
		return nil, err
	}
	sealed, err := s.keys.Seal(secret, r.Tenant, id.String())
	if err != nil {
		return nil, err
	}
	until := now.Add(RotationOverlap)
	body, err := json.Marshal(Rotated{ID: id.String(), Secret: sealedMarker(sealed), PreviousSecretExpiresAt: FormatTime(until)})
	if err != nil {
		return nil, fmt.Errorf("render rotation: %w", err)
	}
	return &idempotency.Plan{Outcome: OutcomeRotated, Body: body, Resource: resource, Effect: true, Write: nothingWrite,
		Then: func(b *pgx.Batch) error {
			b.Queue(sqlEndpointRotate, r.Tenant, pgUUID(id), sealed, until, string(idempotency.Claimed))
			return nil
		}}, nil
}

// sealedPrefix starts the secret member of a recorded body: the secret
// sealed as the endpoint's row holds it, never the secret itself
// (decision 0082). No secret starts so (they start whsec_).
const sealedPrefix = "sealed:"

func sealedMarker(sealed []byte) string {
	return sealedPrefix + base64.StdEncoding.EncodeToString(sealed)
}

// opened returns out with its body's sealed secret, if any, opened: the
// answer of an execution and of every replay of it is the same bytes, the
// recorded body with the marker's string replaced by the secret's.
func (s *Service) opened(tenant string, out Answer, err error) (Answer, error) {
	if err != nil || out.Body == nil {
		return out, err
	}
	body, err := s.open(tenant, out.Body)
	if err != nil {
		return Answer{}, err
	}
	out.Body = body
	return out, nil
}

// open replaces the sealed secret of a recorded body with the secret.
func (s *Service) open(tenant string, body []byte) ([]byte, error) {
	var m struct {
		ID     string `json:"id"`
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal(body, &m); err != nil || !strings.HasPrefix(m.Secret, sealedPrefix) {
		return body, nil // a refusal's problem: nothing sealed
	}
	sealed, err := base64.StdEncoding.DecodeString(m.Secret[len(sealedPrefix):])
	if err != nil {
		return nil, fmt.Errorf("recorded webhook secret: %w", err)
	}
	secret, err := s.keys.Open(sealed, tenant, m.ID)
	if err != nil {
		return nil, fmt.Errorf("open the recorded webhook secret: %w", err)
	}
	from, err := jsontext.AppendQuote(nil, m.Secret)
	if err != nil {
		return nil, err
	}
	to, err := jsontext.AppendQuote(nil, secret)
	if err != nil {
		return nil, err
	}
	return bytes.Replace(body, from, to, 1), nil
}

// RedactRecorded returns a recorded body as an operation lookup shows it:
// a sealed secret as null (the secret is shown by the write's answer and
// its replays only).
func RedactRecorded(body []byte) []byte {
	var m struct {
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal(body, &m); err != nil || !strings.HasPrefix(m.Secret, sealedPrefix) {
		return body
	}
	from, err := jsontext.AppendQuote(nil, m.Secret)
	if err != nil {
		return body
	}
	return bytes.Replace(body, from, []byte("null"), 1)
}

// pgUUID passes a UUID to pgx in binary.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }
