package notes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/outbox"
)

// The actions' parameter versions. A version changes whenever the meaning
// of a parameter or a default changes, so that an old key never silently
// matches a new meaning.
const (
	createVersion = 1
	deleteVersion = 1
)

// Config tunes the service: the idempotency protocol's settings, which
// are all a note write has.
type Config = idempotency.Config

// Observer receives the service's counts (see internal/metrics); the
// protocol's.
type Observer = idempotency.Observer

type nopObserver struct{}

func (nopObserver) Idempotency(string, string) {}
func (nopObserver) BusinessEffect(string)      {}

// signaling wakes the relays after every committed business effect (each
// writes an event), besides counting it.
type signaling struct {
	Observer
	notifier *outbox.Notifier
}

func (o signaling) BusinessEffect(action string) {
	o.Observer.BusinessEffect(action)
	o.notifier.Signal()
}

// Service performs note writes as idempotent operations and answers reads.
type Service struct {
	pool     *pgxpool.Pool
	cfg      Config
	log      zerolog.Logger
	now      func() time.Time
	obs      Observer
	notifier *outbox.Notifier
	// proto runs every write under the idempotency contract.
	proto *idempotency.Protocol
	// fair shares the pool's connections among tenants by turns when they
	// are contended (db.Fair): a tenant flooding within its concurrency
	// limit does not hold the pool against the others.
	fair *db.Fair
	// ids holds the database's id secret once read (ids.go).
	ids idSecret
}

// Option configures a Service.
type Option func(*Service)

// WithClock sets the clock (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// WithObserver sets where counts go (default: nowhere).
func WithObserver(o Observer) Option { return func(s *Service) { s.obs = o } }

// WithNotifier sets who wakes the relays after a commit that wrote events.
func WithNotifier(n *outbox.Notifier) Option { return func(s *Service) { s.notifier = n } }

// Retentions returns the response and key retentions the service runs
// with (QUILL_IDEMPOTENCY_RETENTION, QUILL_KEY_RETENTION), defaults applied.
func (s *Service) Retentions() (response, key time.Duration) {
	return s.cfg.ResponseRetention, s.cfg.KeyRetention
}

// NewService returns a service over pool. It returns an error when cfg,
// after defaults, is invalid.
func NewService(pool *pgxpool.Pool, cfg Config, log zerolog.Logger, opts ...Option) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("notes config: %w", err)
	}
	s := &Service{pool: pool, cfg: cfg, log: log, now: time.Now, obs: nopObserver{},
		fair: db.NewFair(int(pool.Config().MaxConns))}
	for _, o := range opts {
		o(s)
	}
	s.proto = idempotency.NewProtocol(pool, cfg, log, s.now, signaling{Observer: s.obs, notifier: s.notifier}, gate{s})
	return s, nil
}

// FlushReplays adds the replays counted since the last flush to their
// operations (idempotency.Protocol.FlushReplays) and returns how many it
// wrote; on failure the counts are kept for the next flush.
func (s *Service) FlushReplays(ctx context.Context) (int64, error) { return s.proto.FlushReplays(ctx) }

// RunReplayCounter writes the replay counts every ReplayFlushInterval until
// ctx ends, and once more then (idempotency.Protocol.RunReplayCounter).
// It returns nil.
func (s *Service) RunReplayCounter(ctx context.Context) error { return s.proto.RunReplayCounter(ctx) }

// gate hands the protocol the pool in a tenant's turn, as the reads take it.
type gate struct{ s *Service }

func (g gate) Turn(ctx context.Context, tenant string) (func(), error) { return g.s.turn(ctx, tenant) }

func (g gate) Acquire(ctx context.Context, tenant string) (idempotency.Querier, func(), error) {
	c, err := g.s.acquire(ctx, tenant)
	if err != nil {
		return nil, nil, err
	}
	return c, c.Release, nil
}

// Request identifies one write request: the authenticated tenant, the
// operation key and how long it may wait for a concurrent request with the
// same key (negative: the configured default; capped at the default).
type Request struct {
	Tenant string
	Key    string
	Wait   time.Duration
	// Traceparent and Tracestate are the W3C trace context of the
	// request's span, carried into the outbox event as the parent of its
	// publish; empty when there is none.
	Traceparent string
	Tracestate  string
	// Render renders the response body recorded for the operation when
	// this request executes it; required.
	Render Render
}

// Outcomes a note write is recorded with: what it did. The API maps each to
// its status and headers (SPEC §3).
const (
	OutcomeCreated         = "created"
	OutcomeDeleted         = "deleted"
	OutcomeNothingToDelete = "nothing_to_delete"
)

// Result is what an executed write produced, for Render to turn into the
// recorded body.
type Result struct {
	// Outcome is one of the Outcome constants.
	Outcome string
	// Resource is the path of the note the write created or acted on,
	// e.g. /v1/notes/{id}.
	Resource string
	// Note is the created note (a create).
	Note *NoteView
	// Deleted is the deleted note (a delete).
	Deleted *DeleteResult
	// Err is the domain error the operation is recorded with:
	// ErrNothingToDelete for a delete that found no live note. Note and
	// Deleted are nil then.
	Err error
}

// Render turns an executed write's result into the response body recorded
// for the operation and replayed, byte for byte, to every later request
// with its key (decision 0028). It runs inside the write, before the
// commit; an error aborts the write (nothing is committed).
type Render func(Result) ([]byte, error)

// Answer is a write's answer: the recorded outcome (an Outcome constant),
// body and resource, and whether it is a replay of an earlier execution.
type Answer = idempotency.Answer

// clock returns the service clock truncated to what PostgreSQL stores, so
// that a recorded time and a later read agree.
func (s *Service) clock() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

// errNoRender: a write request came without its Render.
var errNoRender = errors.New("notes: the write request has no Render")

// protocolRequest is r's request to the protocol, fp's, planned by plan.
func (r Request) protocolRequest(fp idempotency.Fingerprint, plan func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error)) idempotency.Request {
	return idempotency.Request{Tenant: r.Tenant, Key: r.Key, Wait: r.Wait, Fingerprint: fp, Plan: plan}
}

// Create creates a note as the operation (r.Tenant, r.Key); the note's id
// is derived from the operation (ids.go). Errors: *idempotency.KeyReusedError,
// *idempotency.ExpiredError, idempotency.ErrInProgress,
// *idempotency.UnavailableError, ErrKeyGenerations (the key made
// maxGenerations notes already), and others for unexpected failures
// (nothing committed).
func (s *Service) Create(ctx context.Context, r Request, p CreateParams) (Answer, error) {
	if r.Render == nil {
		return Answer{}, errNoRender
	}
	params := idempotency.Params{"title": p.Title, "body": p.Body, "attachment": nil}
	if a := p.Attachment; a != nil {
		params["attachment"] = map[string]any{"filename": a.Filename, "content_type": a.ContentType,
			"size": len(a.Data), "sha256": a.SHA256}
	}
	fp, err := idempotency.NewFingerprint(contract.ActionCreateNote, createVersion, params)
	if err != nil {
		return Answer{}, err
	}
	secret, err := s.ids.get(ctx, s.pool)
	if err != nil {
		return Answer{}, s.unavailable(err)
	}
	// The note id is derived from the operation (ids.go); a key used for a
	// new intent after it was forgotten finds its earlier notes' ids taken,
	// and each refusal (nothing committed) moves it to the next generation.
	for gen := 0; ; gen++ {
		out, err := s.proto.Run(ctx, r.protocolRequest(fp, func(_ context.Context, _ *db.Pipeline, now time.Time) (*idempotency.Plan, error) {
			return s.planCreate(r, p, secret, gen, now)
		}))
		if !noteIDTaken(err) {
			return out, err
		}
		if gen+1 >= maxGenerations {
			return Answer{}, fmt.Errorf("create note: %w", ErrKeyGenerations)
		}
	}
}

// noteIDTaken reports whether err is a unique constraint refusing an id
// derived from the note's: a note of an earlier generation of the key has
// it. In one statement (ClaimWrite) whichever of the note's, its
// attachment's or its event's constraints is checked first refuses it.
func noteIDTaken(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.UniqueViolation {
		return false
	}
	switch pgErr.ConstraintName {
	case "notes_pkey", "attachments_pkey", "attachments_note_id_key", outbox.EventIDConstraint:
		return true
	}
	return false
}

// Delete deletes note id as the operation (r.Tenant, r.Key). Deleting a note
// that does not exist (or not any more) is recorded as
// OutcomeNothingToDelete. Errors as for Create.
func (s *Service) Delete(ctx context.Context, r Request, id uuid.UUID) (Answer, error) {
	if r.Render == nil {
		return Answer{}, errNoRender
	}
	fp, err := idempotency.NewFingerprint(contract.ActionDeleteNote, deleteVersion, idempotency.Params{"id": id.String()})
	if err != nil {
		return Answer{}, err
	}
	return s.proto.Run(ctx, r.protocolRequest(fp, func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error) {
		return s.planDelete(ctx, tx, r, id, now)
	}))
}

func (s *Service) unavailable(err error) error {
	if errors.Is(db.Translate(err), db.ErrUnavailable) || db.IsConnectionError(err) {
		return &idempotency.UnavailableError{Err: err}
	}
	return err
}

// The rows a create writes, as notes owns them (see db.Insert).
var (
	noteInsert = db.Insert{Table: "notes", Columns: []db.Column{
		{Name: "id", Type: "uuid"}, {Name: "tenant", Type: "text"}, {Name: "title", Type: "text"},
		{Name: "body", Type: "text"}, {Name: "created_at", Type: "timestamptz"},
	}}
	attachmentInsert = db.Insert{Table: "attachments", Columns: []db.Column{
		{Name: "id", Type: "uuid"}, {Name: "tenant", Type: "text"}, {Name: "note_id", Type: "uuid"},
		{Name: "filename", Type: "text"}, {Name: "content_type", Type: "text"}, {Name: "size", Type: "int"},
		{Name: "sha256", Type: "text"}, {Name: "data", Type: "bytea"},
	}}

	// A create in one statement: the claim, the note (and its
	// attachment), its event and the record.
	createWrite               = idempotency.NewClaimWrite(noteInsert, outbox.EventInsert)
	createWithAttachmentWrite = idempotency.NewClaimWrite(noteInsert, attachmentInsert, outbox.EventInsert)
)

const (
	// sqlNoteLock locks the note a delete acts on, before the claim, so
	// that whether it is live holds until the COMMIT; the lock orders the
	// delete's event after every other event of the note committed before
	// it. No row: no such note.
	sqlNoteLock = `SELECT deleted_at IS NULL FROM notes WHERE tenant = $1 AND id = $2 FOR UPDATE`

	// sqlNoteDelete follows the claim, guarded by idempotency.Claimed.
	sqlNoteDelete = `UPDATE notes SET deleted_at = $3 WHERE tenant = $1 AND id = $2 AND current_setting($4::text)::boolean`
)

var (
	// A delete that deletes writes its event with the record; one that
	// finds nothing writes the record only.
	deleteWrite  = idempotency.NewClaimWrite(outbox.EventInsert)
	nothingWrite = idempotency.NewClaimWrite()
)

func (s *Service) planCreate(r Request, p CreateParams, secret []byte, generation int, now time.Time) (*idempotency.Plan, error) {
	id := NoteID(secret, r.Tenant, r.Key, generation)
	n := Note{ID: id, Tenant: r.Tenant, Title: p.Title, Body: p.Body, CreatedAt: now}
	var aid uuid.UUID
	if a := p.Attachment; a != nil {
		aid = AttachmentID(id)
		n.Attachment = &Attachment{ID: aid, NoteID: id, Filename: a.Filename, ContentType: a.ContentType,
			Size: len(a.Data), SHA256: a.SHA256, Status: AttachmentPending}
	}
	view := n.View()
	resource := contract.NotePath(id.String())
	body, err := r.Render(Result{Outcome: OutcomeCreated, Resource: resource, Note: &view})
	if err != nil {
		return nil, fmt.Errorf("render create: %w", err)
	}
	plan := &idempotency.Plan{Outcome: OutcomeCreated, Body: body, Resource: resource, Effect: true}
	noteArgs := []any{pgUUID(n.ID), n.Tenant, n.Title, n.Body, n.CreatedAt}
	event, err := outbox.InsertArgs(s.event(r, contract.EventNoteCreated, id, now, view))
	if err != nil {
		return nil, err
	}
	if a := p.Attachment; a != nil {
		attArgs := []any{pgUUID(aid), r.Tenant, pgUUID(id), a.Filename, a.ContentType, len(a.Data), a.SHA256, a.Data}
		plan.Write, plan.Args = createWithAttachmentWrite, [][]any{noteArgs, attArgs, event}
	} else {
		plan.Write, plan.Args = createWrite, [][]any{noteArgs, event}
	}
	return plan, nil
}

// DeleteResult is what a successful delete did.
type DeleteResult struct {
	ID        string `json:"id"`
	DeletedAt string `json:"deleted_at"`
}

// planDelete reads, under the note's row lock, whether note id is live,
// and plans its delete: the event and the guarded UPDATE, or the record of
// nothing to delete.
func (s *Service) planDelete(ctx context.Context, tx *db.Pipeline, r Request, id uuid.UUID, now time.Time) (*idempotency.Plan, error) {
	var live bool
	err := tx.QueryRow(ctx, sqlNoteLock, r.Tenant, pgUUID(id)).Scan(&live)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("lock note: %w", db.Translate(err))
	}
	resource := contract.NotePath(id.String())
	if !live {
		body, err := r.Render(Result{Outcome: OutcomeNothingToDelete, Resource: resource, Err: ErrNothingToDelete})
		if err != nil {
			return nil, fmt.Errorf("render delete: %w", err)
		}
		return &idempotency.Plan{Outcome: OutcomeNothingToDelete, Body: body, Resource: resource, Write: nothingWrite}, nil
	}
	res := DeleteResult{ID: id.String(), DeletedAt: FormatTime(now)}
	body, err := r.Render(Result{Outcome: OutcomeDeleted, Resource: resource, Deleted: &res})
	if err != nil {
		return nil, fmt.Errorf("render delete: %w", err)
	}
	event, err := outbox.InsertArgs(s.event(r, contract.EventNoteDeleted, id, now, res))
	if err != nil {
		return nil, err
	}
	return &idempotency.Plan{Outcome: OutcomeDeleted, Body: body, Resource: resource, Effect: true,
		Write: deleteWrite, Args: [][]any{event},
		Then: func(b *pgx.Batch) error {
			b.Queue(sqlNoteDelete, r.Tenant, pgUUID(id), now, string(idempotency.Claimed))
			return nil
		}}, nil
}

// pgUUID passes a UUID to pgx in binary; a uuid.UUID would go through its
// string form.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// event is the event of type typ that operation r writes about note noteID.
func (s *Service) event(r Request, typ string, noteID uuid.UUID, now time.Time, data any) outbox.Event {
	return outbox.Event{ID: EventID(noteID, typ), Tenant: r.Tenant, OperationKey: r.Key, AggregateID: noteID,
		Type: typ, Time: now, Data: data, Traceparent: r.Traceparent, Tracestate: r.Tracestate}
}
