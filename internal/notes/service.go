package notes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-json-experiment/json/jsontext"
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
	updateVersion = 1
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
	// group, when set, carries the creates' transactions (WithGroup).
	group *db.Group
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

// WithGroup makes creates, whose transactions are one round trip each,
// travel through g: concurrent creates share a pipelined write and its
// reply (idempotency.Protocol.UseGroup, decision 0103). The caller closes
// g after the service's last request.
func WithGroup(g *db.Group) Option { return func(s *Service) { s.group = g } }

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
	if s.group != nil {
		s.proto.UseGroup(s.group)
	}
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
	// IfMatch is the note version the request's If-Match names: required
	// by an update, optional for a delete (0: none). It is one of the
	// operation's parameters.
	IfMatch int
	// Render renders the response body recorded for the operation when
	// this request executes it; required.
	Render Render
}

// Outcomes a note write is recorded with: what it did. The API maps each to
// its status and headers (SPEC §3).
const (
	OutcomeCreated         = "created"
	OutcomeUpdated         = "updated"
	OutcomeUnchanged       = "unchanged"
	OutcomeNothingToUpdate = "nothing_to_update"
	OutcomeDeleted         = "deleted"
	OutcomeNothingToDelete = "nothing_to_delete"
	// OutcomeVersionMismatch: an update or a delete whose If-Match named
	// another version than the note's.
	OutcomeVersionMismatch = "version_mismatch"
)

// Result is what an executed write produced, for Render to turn into the
// recorded body.
type Result struct {
	// Outcome is one of the Outcome constants.
	Outcome string
	// Resource is the path of the note the write created or acted on,
	// e.g. /v1/notes/{id}.
	Resource string
	// Note is the created note (a create), or the note as an update left
	// it.
	Note *NoteView
	// NoteJSON is Note as JSON when the service rendered it (a create):
	// the bytes its note.created event carries as data. A renderer that
	// answers the note as it is answers these bytes, so that the answer,
	// the record and the event share one rendering.
	NoteJSON jsontext.Value
	// Deleted is the deleted note (a delete).
	Deleted *DeleteResult
	// Err is the domain error the operation is recorded with:
	// ErrNothingToDelete or ErrNothingToUpdate when there was no live note,
	// a *VersionMismatchError when If-Match named another version. Note and
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
		req := r.protocolRequest(fp, nil)
		req.PlanOneTrip = func(args *db.Args, now time.Time) (*idempotency.Plan, error) {
			return s.planCreate(args, r, p, secret, gen, now)
		}
		out, err := s.proto.Run(ctx, req)
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
	if err == nil {
		return false // before errors.As, whose target would escape on every create
	}
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
	params := idempotency.Params{"id": id.String()}
	if r.IfMatch != 0 {
		// Only when sent: a delete without If-Match keeps the fingerprint
		// it had before versions, so that its key still replays.
		params["if_match"] = r.IfMatch
	}
	fp, err := idempotency.NewFingerprint(contract.ActionDeleteNote, deleteVersion, params)
	if err != nil {
		return Answer{}, err
	}
	return s.proto.Run(ctx, r.protocolRequest(fp, func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error) {
		return s.planDelete(ctx, tx, r, id, now)
	}))
}

// errNoIfMatch: an update request came without its If-Match.
var errNoIfMatch = errors.New("notes: an update needs the version it is made against (Request.IfMatch)")

// Update sets p's fields of note id as the operation (r.Tenant, r.Key), made
// against version r.IfMatch. The outcome is recorded whatever it is: the
// note updated to the next version with its note.updated event, or
// unchanged (p sets what the note holds: no version, no event), or
// ErrNothingToUpdate, or a *VersionMismatchError naming the note's version
// — so that a retry under the key replays it even after the note changed
// since. Errors as for Create.
func (s *Service) Update(ctx context.Context, r Request, id uuid.UUID, p UpdateParams) (Answer, error) {
	if r.Render == nil {
		return Answer{}, errNoRender
	}
	if r.IfMatch <= 0 {
		return Answer{}, errNoIfMatch
	}
	params := idempotency.Params{"id": id.String(), "if_match": r.IfMatch, "title": nil, "body": nil}
	if p.Title != nil {
		params["title"] = *p.Title
	}
	if p.Body != nil {
		params["body"] = *p.Body
	}
	fp, err := idempotency.NewFingerprint(contract.ActionUpdateNote, updateVersion, params)
	if err != nil {
		return Answer{}, err
	}
	return s.proto.Run(ctx, r.protocolRequest(fp, func(ctx context.Context, tx *db.Pipeline, now time.Time) (*idempotency.Plan, error) {
		return s.planUpdate(ctx, tx, r, id, p, now)
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
		{Name: "version", Type: "int"}, {Name: "updated_at", Type: "timestamptz"},
	}}
	attachmentInsert = db.Insert{Table: "attachments", Columns: []db.Column{
		{Name: "id", Type: "uuid"}, {Name: "tenant", Type: "text"}, {Name: "note_id", Type: "uuid"},
		{Name: "filename", Type: "text"}, {Name: "content_type", Type: "text"}, {Name: "size", Type: "int"},
		{Name: "sha256", Type: "text"}, {Name: "data", Type: "bytea"}, {Name: "operation_key", Type: "text"},
	}}

	// A create in one statement: the claim, the note (and its
	// attachment), its event and the record.
	createWrite               = idempotency.NewClaimWrite(noteInsert, outbox.EventInsert)
	createWithAttachmentWrite = idempotency.NewClaimWrite(noteInsert, attachmentInsert, outbox.EventInsert)
)

const (
	// sqlNoteLock locks the note a delete acts on, before the claim, so
	// that whether it is live, and its version, hold until the COMMIT; the
	// lock orders the delete's event after every other event of the note
	// committed before it. No row: no such note.
	sqlNoteLock = `SELECT deleted_at IS NULL, version FROM notes WHERE tenant = $1 AND id = $2 FOR UPDATE`

	// sqlNoteDelete follows the claim, guarded by idempotency.Claimed. The
	// delete is a version of its own: its event orders after every update.
	sqlNoteDelete = `UPDATE notes SET deleted_at = $3, version = version + 1
	WHERE tenant = $1 AND id = $2 AND current_setting($4::text)::boolean`

	// sqlNoteLockLive reads and locks the live note an update acts on, as
	// a read shows it: its version and fields hold until the COMMIT, and
	// concurrent updates of the note take turns, so that exactly one of
	// two made against one version is accepted and the note's events
	// commit in version order.
	sqlNoteLockLive = sqlNoteGet + ` FOR UPDATE OF n`

	// sqlNoteUpdate follows the claim, guarded by idempotency.Claimed.
	sqlNoteUpdate = `UPDATE notes SET title = $3, body = $4, version = $5, updated_at = $6
	WHERE tenant = $1 AND id = $2 AND current_setting($7::text)::boolean`
)

var (
	// A write that changes the note writes its event with the record (a
	// delete that deletes, an update that changes it); one that finds
	// nothing, or refuses, writes the record only.
	eventWrite   = idempotency.NewClaimWrite(outbox.EventInsert)
	nothingWrite = idempotency.NewClaimWrite()
)

func (s *Service) planCreate(args *db.Args, r Request, p CreateParams, secret []byte, generation int, now time.Time) (*idempotency.Plan, error) {
	id := NoteID(secret, r.Tenant, r.Key, generation)
	n := Note{ID: id, Tenant: r.Tenant, Title: p.Title, Body: p.Body, CreatedAt: now, Version: 1, UpdatedAt: now}
	var aid uuid.UUID
	if a := p.Attachment; a != nil {
		aid = AttachmentID(id)
		n.Attachment = &Attachment{ID: aid, NoteID: id, Filename: a.Filename, ContentType: a.ContentType,
			Size: len(a.Data), SHA256: a.SHA256, Status: AttachmentPending}
	}
	view := n.View()
	resource := contract.NotePath(view.ID)
	noteJSON, err := view.AppendJSON(make([]byte, 0, view.jsonSize()))
	if err != nil {
		return nil, fmt.Errorf("render create: %w", err)
	}
	body, err := r.Render(Result{Outcome: OutcomeCreated, Resource: resource, Note: &view, NoteJSON: noteJSON})
	if err != nil {
		return nil, fmt.Errorf("render create: %w", err)
	}
	plan := &idempotency.Plan{Outcome: OutcomeCreated, Body: body, Resource: resource, ResourceVersion: n.Version, Effect: true}
	noteArgs := []any{args.UUID(n.ID), args.Text(n.Tenant), args.Text(n.Title), args.Text(n.Body), args.Time(n.CreatedAt), n.Version, args.Time(n.UpdatedAt)}
	event, err := outbox.InsertArgsIn(args, s.event(r, contract.EventNoteCreated, id, n.Version, now, jsontext.Value(noteJSON)))
	if err != nil {
		return nil, err
	}
	if a := p.Attachment; a != nil {
		// The key goes with the attachment so that the worker's
		// attachment.processed is written under it: the create's lookup
		// lists it among the operation's effects.
		attArgs := []any{args.UUID(aid), args.Text(r.Tenant), args.UUID(id), args.Text(a.Filename), args.Text(a.ContentType), len(a.Data),
			args.Text(a.SHA256), args.Bytes(a.Data), args.Text(r.Key)}
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

// deletedData is a note.deleted event's data: the delete's answer and the
// version the delete made.
type deletedData struct {
	ID        string `json:"id"`
	DeletedAt string `json:"deleted_at"`
	Version   int    `json:"version"`
}

// refusal plans the record of a write that changes nothing and answers
// err: no live note, or another version than If-Match names.
func refusal(r Request, what, outcome, resource string, err error) (*idempotency.Plan, error) {
	body, rerr := r.Render(Result{Outcome: outcome, Resource: resource, Err: err})
	if rerr != nil {
		return nil, fmt.Errorf("render %s: %w", what, rerr)
	}
	return &idempotency.Plan{Outcome: outcome, Body: body, Resource: resource, Write: nothingWrite}, nil
}

// planDelete reads, under the note's row lock, whether note id is live and
// its version, and plans its delete: the event and the guarded UPDATE, or
// the record of nothing to delete, or of another version than If-Match
// names.
func (s *Service) planDelete(ctx context.Context, tx *db.Pipeline, r Request, id uuid.UUID, now time.Time) (*idempotency.Plan, error) {
	var (
		live    bool
		version int
	)
	err := tx.QueryRow(ctx, sqlNoteLock, r.Tenant, pgUUID(id)).Scan(&live, &version)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("lock note: %w", db.Translate(err))
	}
	resource := contract.NotePath(id.String())
	switch {
	case !live:
		return refusal(r, "delete", OutcomeNothingToDelete, resource, ErrNothingToDelete)
	case r.IfMatch != 0 && r.IfMatch != version:
		return refusal(r, "delete", OutcomeVersionMismatch, resource, &VersionMismatchError{Expected: r.IfMatch, Current: version})
	}
	res := DeleteResult{ID: id.String(), DeletedAt: FormatTime(now)}
	body, err := r.Render(Result{Outcome: OutcomeDeleted, Resource: resource, Deleted: &res})
	if err != nil {
		return nil, fmt.Errorf("render delete: %w", err)
	}
	event, err := outbox.InsertArgsIn(tx.Args(), s.event(r, contract.EventNoteDeleted, id, version+1, now,
		deletedData{ID: res.ID, DeletedAt: res.DeletedAt, Version: version + 1}))
	if err != nil {
		return nil, err
	}
	return &idempotency.Plan{Outcome: OutcomeDeleted, Body: body, Resource: resource, ResourceVersion: version + 1, Effect: true,
		Write: eventWrite, Args: [][]any{event},
		Then: func(b *pgx.Batch) error {
			b.Queue(sqlNoteDelete, r.Tenant, pgUUID(id), now, string(idempotency.Claimed))
			return nil
		}}, nil
}

// updatedData is a note.updated event's data: the version the update made
// and only the fields it changed (SPEC §5).
type updatedData struct {
	ID        string  `json:"id"`
	Version   int     `json:"version"`
	Title     *string `json:"title,omitzero"`
	Body      *string `json:"body,omitzero"`
	UpdatedAt string  `json:"updated_at"`
}

// planUpdate reads and locks the live note id and plans the update: the
// next version and its event with the guarded UPDATE, or the record of an
// update that changes nothing, of no live note, or of another version than
// If-Match names.
func (s *Service) planUpdate(ctx context.Context, tx *db.Pipeline, r Request, id uuid.UUID, p UpdateParams, now time.Time) (*idempotency.Plan, error) {
	resource := contract.NotePath(id.String())
	n, err := scanNote(tx.QueryRow(ctx, sqlNoteLockLive, r.Tenant, pgUUID(id)))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return refusal(r, "update", OutcomeNothingToUpdate, resource, ErrNothingToUpdate)
	case err != nil:
		return nil, fmt.Errorf("lock note: %w", db.Translate(err))
	case r.IfMatch != n.Version:
		return refusal(r, "update", OutcomeVersionMismatch, resource, &VersionMismatchError{Expected: r.IfMatch, Current: n.Version})
	}
	data := updatedData{ID: id.String(), Version: n.Version + 1, UpdatedAt: FormatTime(now)}
	if p.Title != nil && *p.Title != n.Title {
		n.Title, data.Title = *p.Title, p.Title
	}
	if p.Body != nil && *p.Body != n.Body {
		n.Body, data.Body = *p.Body, p.Body
	}
	if data.Title == nil && data.Body == nil {
		// Recorded and replayable, but no version and no event: nothing
		// changed that a consumer could apply.
		view := n.View()
		body, err := r.Render(Result{Outcome: OutcomeUnchanged, Resource: resource, Note: &view})
		if err != nil {
			return nil, fmt.Errorf("render update: %w", err)
		}
		return &idempotency.Plan{Outcome: OutcomeUnchanged, Body: body, Resource: resource, ResourceVersion: n.Version,
			Write: nothingWrite}, nil
	}
	n.Version, n.UpdatedAt = data.Version, now
	view := n.View()
	body, err := r.Render(Result{Outcome: OutcomeUpdated, Resource: resource, Note: &view})
	if err != nil {
		return nil, fmt.Errorf("render update: %w", err)
	}
	event, err := outbox.InsertArgsIn(tx.Args(), s.event(r, contract.EventNoteUpdated, id, n.Version, now, data))
	if err != nil {
		return nil, err
	}
	return &idempotency.Plan{Outcome: OutcomeUpdated, Body: body, Resource: resource, ResourceVersion: n.Version, Effect: true,
		Write: eventWrite, Args: [][]any{event},
		Then: func(b *pgx.Batch) error {
			b.Queue(sqlNoteUpdate, r.Tenant, pgUUID(id), n.Title, n.Body, n.Version, now, string(idempotency.Claimed))
			return nil
		}}, nil
}

// pgUUID passes a UUID to pgx in binary; a uuid.UUID would go through its
// string form.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// event is the event of type typ that operation r writes about note noteID,
// which it leaves at version.
func (s *Service) event(r Request, typ string, noteID uuid.UUID, version int, now time.Time, data any) outbox.Event {
	return outbox.Event{ID: NoteEventID(noteID, version, r.Key), Tenant: r.Tenant, OperationKey: r.Key, AggregateID: noteID,
		Type: typ, Time: now, Data: data, Traceparent: r.Traceparent, Tracestate: r.Tracestate}
}
