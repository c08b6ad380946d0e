package notes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
)

const (
	noteColumns = `n.id, n.tenant, n.title, n.body, n.created_at, n.version, coalesce(n.updated_at, n.created_at),
		a.id, a.filename, a.content_type, a.size, a.sha256, a.status, a.result, a.reason, a.processed_at`

	sqlNoteGet = `SELECT ` + noteColumns + `
	FROM notes n LEFT JOIN attachments a ON a.note_id = n.id
	WHERE n.tenant = $1 AND n.id = $2 AND n.deleted_at IS NULL`

	sqlNoteList = `SELECT ` + noteColumns + `
	FROM notes n LEFT JOIN attachments a ON a.note_id = n.id
	WHERE n.tenant = $1 AND n.deleted_at IS NULL
	AND ($2::uuid IS NULL OR (n.created_at, n.id) < (SELECT c.created_at, c.id FROM notes c WHERE c.tenant = $1 AND c.id = $2))
	ORDER BY n.created_at DESC, n.id DESC LIMIT $3`

	sqlAttachmentContent = `SELECT a.content_type, a.filename, a.data
	FROM attachments a JOIN notes n ON n.id = a.note_id
	WHERE n.tenant = $1 AND n.id = $2 AND n.deleted_at IS NULL`

	sqlAttachmentThumbnail = `SELECT a.thumbnail
	FROM attachments a JOIN notes n ON n.id = a.note_id
	WHERE n.tenant = $1 AND n.id = $2 AND n.deleted_at IS NULL AND a.status = 'processed' AND a.thumbnail IS NOT NULL`
)

func scanNote(row pgx.Row) (*Note, error) {
	var n Note
	var (
		aID                             *uuid.UUID
		aFilename, aType, aSHA, aStatus *string
		aSize                           *int
		aResult                         []byte
		aReason                         *string
		aProcessed                      *time.Time
	)
	if err := row.Scan(&n.ID, &n.Tenant, &n.Title, &n.Body, &n.CreatedAt, &n.Version, &n.UpdatedAt,
		&aID, &aFilename, &aType, &aSize, &aSHA, &aStatus, &aResult, &aReason, &aProcessed); err != nil {
		return nil, err
	}
	if aID != nil {
		n.Attachment = &Attachment{ID: *aID, NoteID: n.ID, Filename: *aFilename, ContentType: *aType,
			Size: *aSize, SHA256: *aSHA, Status: *aStatus, Result: jsontext.Value(aResult), ProcessedAt: aProcessed}
		if aReason != nil {
			n.Attachment.Reason = *aReason
		}
	}
	return &n, nil
}

// readErr translates a read's error: no rows → ErrNotFound, an unreachable
// database → *idempotency.UnavailableError.
func readErr(what string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	if errors.Is(db.Translate(err), db.ErrUnavailable) {
		return &idempotency.UnavailableError{Err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// acquire takes a pool connection for a read by tenant, in the tenant's
// turn (turn), waiting at most Config.AcquireTimeout in all; past it the
// error wraps db.ErrPoolTimeout (readErr makes it an *idempotency.UnavailableError).
// The caller releases the connection, which gives the turn back.
func (s *Service) acquire(ctx context.Context, tenant string) (*heldConn, error) {
	start := time.Now()
	turn, err := s.turn(ctx, tenant)
	if err != nil {
		return nil, err
	}
	timeout := s.cfg.AcquireTimeout
	if timeout > 0 {
		// What the turn took counts against the same wait (at least a
		// millisecond is left, as zero would mean no bound).
		timeout = max(time.Millisecond, timeout-time.Since(start))
	}
	conn, err := db.Acquire(ctx, s.pool, timeout)
	if err != nil {
		turn()
		return nil, err
	}
	return &heldConn{Conn: conn, turn: turn}, nil
}

// Turn waits for tenant's turn at the pool the service shares among
// tenants (db.Fair) and returns the function that gives it back; another
// service on the same pool (webhooks.WithTurns) takes its turns through
// it. Errors as for turn.
func (s *Service) Turn(ctx context.Context, tenant string) (release func(), err error) {
	return s.turn(ctx, tenant)
}

// turn waits for tenant's turn at the pool (db.Fair), at most
// Config.AcquireTimeout; past it the error wraps db.ErrPoolTimeout. The
// returned function gives the turn back.
func (s *Service) turn(ctx context.Context, tenant string) (func(), error) {
	if release := s.fair.TryAcquire(tenant); release != nil {
		return release, nil // the common case: no timer
	}
	tctx := ctx
	if s.cfg.AcquireTimeout > 0 {
		var cancel context.CancelFunc
		tctx, cancel = context.WithTimeout(ctx, s.cfg.AcquireTimeout)
		defer cancel()
	}
	release, err := s.fair.Acquire(tctx, tenant)
	if err != nil {
		if ctx.Err() == nil {
			return nil, fmt.Errorf("wait for the tenant's turn at the pool within %s: %w", s.cfg.AcquireTimeout, db.ErrPoolTimeout)
		}
		return nil, fmt.Errorf("wait for the tenant's turn at the pool: %w", ctx.Err())
	}
	return release, nil
}

// heldConn is a pool connection taken in a tenant's turn; Release gives
// both back.
type heldConn struct {
	*pgxpool.Conn
	turn func()
}

// Release releases the connection and the turn.
func (c *heldConn) Release() {
	c.Conn.Release()
	c.turn()
}

// Get returns the tenant's live note id. Errors: ErrNotFound,
// *idempotency.UnavailableError.
func (s *Service) Get(ctx context.Context, tenant string, id uuid.UUID) (*Note, error) {
	conn, err := s.acquire(ctx, tenant)
	if err != nil {
		return nil, readErr("get note", err)
	}
	defer conn.Release()
	n, err := scanNote(conn.QueryRow(ctx, sqlNoteGet, tenant, pgUUID(id)))
	if err != nil {
		return nil, readErr("get note", err)
	}
	return n, nil
}

// List returns up to limit of the tenant's live notes, newest first,
// starting after the note with id after (nil: from the newest), and stops
// early once the notes read hold maxBytes of title and body (0: no byte
// bound), so that a page of large notes is not all read into memory; it
// always returns at least one note when there is one. next is the cursor
// of the following page, nil on the last one. Errors: *idempotency.UnavailableError.
func (s *Service) List(ctx context.Context, tenant string, limit int, after *uuid.UUID, maxBytes int) (notes []*Note, next *uuid.UUID, err error) {
	var cursor pgtype.UUID
	if after != nil {
		cursor = pgUUID(*after)
	}
	conn, err := s.acquire(ctx, tenant)
	if err != nil {
		return nil, nil, readErr("list notes", err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, sqlNoteList, tenant, cursor, limit+1)
	if err != nil {
		return nil, nil, readErr("list notes", err)
	}
	defer rows.Close()
	size := 0
	for rows.Next() {
		if maxBytes > 0 && size >= maxBytes {
			// Enough for the page: the rows not read are where the
			// next page starts.
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, nil, readErr("list notes", err)
			}
			id := notes[len(notes)-1].ID
			return notes, &id, nil
		}
		n, err := scanNote(rows)
		if err != nil {
			return nil, nil, readErr("list notes", err)
		}
		notes = append(notes, n)
		size += len(n.Title) + len(n.Body)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, readErr("list notes", err)
	}
	if len(notes) > limit {
		notes = notes[:limit]
		id := notes[limit-1].ID
		next = &id
	}
	return notes, next, nil
}

// Attachment returns the attachment of the tenant's live note. Errors:
// ErrNotFound (no note, or no attachment), *idempotency.UnavailableError.
func (s *Service) Attachment(ctx context.Context, tenant string, noteID uuid.UUID) (*Attachment, error) {
	n, err := s.Get(ctx, tenant, noteID)
	if err != nil {
		return nil, err
	}
	if n.Attachment == nil {
		return nil, ErrNotFound
	}
	return n.Attachment, nil
}

// AttachmentContent returns the declared content type, the filename and the
// bytes of a live note's attachment. Errors: ErrNotFound, *idempotency.UnavailableError.
func (s *Service) AttachmentContent(ctx context.Context, tenant string, noteID uuid.UUID) (contentType, filename string, data []byte, err error) {
	conn, err := s.acquire(ctx, tenant)
	if err != nil {
		return "", "", nil, readErr("get attachment content", err)
	}
	defer conn.Release()
	err = conn.QueryRow(ctx, sqlAttachmentContent, tenant, pgUUID(noteID)).Scan(&contentType, &filename, &data)
	if err != nil {
		return "", "", nil, readErr("get attachment content", err)
	}
	return contentType, filename, data, nil
}

// Thumbnail returns the PNG thumbnail of a live note's processed image
// attachment. Errors: ErrNotFound (also while not processed, or not an
// image), *idempotency.UnavailableError.
func (s *Service) Thumbnail(ctx context.Context, tenant string, noteID uuid.UUID) ([]byte, error) {
	conn, err := s.acquire(ctx, tenant)
	if err != nil {
		return nil, readErr("get thumbnail", err)
	}
	defer conn.Release()
	var png []byte
	if err := conn.QueryRow(ctx, sqlAttachmentThumbnail, tenant, pgUUID(noteID)).Scan(&png); err != nil {
		return nil, readErr("get thumbnail", err)
	}
	return png, nil
}

// Operation is the outcome lookup of one key (SPEC §4.6); the API shows it.
type Operation struct {
	Key         string
	Action      *string
	State       string
	CreatedAt   *string
	CompletedAt *string
	ExpiresAt   *string
	Resource    *string
	Response    *Response
	Effects     []Effect
}

// Response is a recorded response: the operation's outcome (an Outcome
// constant) and the body rendered for it; nil once the record is a
// tombstone. The API shows it with the status the outcome maps to.
type Response struct {
	Outcome string
	Body    jsontext.Value
}

// Effect is one downstream effect of an operation and its own state. It is
// marshaled as SPEC §4.6 shows its kind: an event always has published_at
// and stream_seq, an attachment always has processed_at — null while the
// effect is pending, so that a client typed from the SPEC finds every
// member it expects.
type Effect struct {
	Kind        string
	ID          string
	Type        string // events only
	State       string
	PublishedAt *string // events only; nil while pending
	StreamSeq   *int64  // events only; nil while pending
	ProcessedAt *string // attachments only; nil while pending
	// Reason says why an attachment failed, or why one stays pending for
	// good (its note was deleted before processing).
	Reason string
	// EndpointID, EventID, Attempts and LastStatus are a webhook
	// delivery's (SPEC §11): the endpoint, the event delivered, the
	// attempts made and the last answer's status (nil before any answer).
	EndpointID, EventID string
	Attempts            int
	LastStatus          *int
}

// Effect kinds.
const (
	EffectEvent      = "event"
	EffectAttachment = "attachment"
	// EffectWebhook is a delivery of one of the operation's events to a
	// webhook endpoint: pending, delivered or failed.
	EffectWebhook = "webhook"
)

// Event effect states. EventForgotten is an addition to SPEC §4.6: the
// operation wrote an event whose outbox row is gone although its record
// kept nothing of it (deleted before migration 00008, or by hand); its id,
// publication time and stream sequence are not known any more (null).
const (
	EventPending   = "pending"
	EventPublished = "published"
	EventForgotten = "forgotten"
)

// eventEffect and attachmentEffect are the JSON of each kind of Effect.
type eventEffect struct {
	Kind        string  `json:"kind"`
	ID          *string `json:"id"` // null when forgotten
	Type        string  `json:"type"`
	State       string  `json:"state"`
	PublishedAt *string `json:"published_at"`
	StreamSeq   *int64  `json:"stream_seq"`
}

type attachmentEffect struct {
	Kind        string  `json:"kind"`
	ID          string  `json:"id"`
	State       string  `json:"state"`
	ProcessedAt *string `json:"processed_at"`
	Reason      string  `json:"reason,omitempty"`
}

type webhookEffect struct {
	Kind       string `json:"kind"`
	EndpointID string `json:"endpoint_id"`
	EventID    string `json:"event_id"`
	State      string `json:"state"`
	Attempts   int    `json:"attempts"`
	LastStatus *int   `json:"last_status"`
}

// MarshalJSON writes e with the members of its kind. It returns the
// encoder's error, or one naming an unknown kind.
func (e Effect) MarshalJSON() ([]byte, error) {
	switch e.Kind {
	case EffectEvent:
		ev := eventEffect{Kind: e.Kind, Type: e.Type, State: e.State, PublishedAt: e.PublishedAt, StreamSeq: e.StreamSeq}
		if e.ID != "" {
			ev.ID = &e.ID
		}
		return json.Marshal(ev)
	case EffectAttachment:
		return json.Marshal(attachmentEffect{Kind: e.Kind, ID: e.ID, State: e.State,
			ProcessedAt: e.ProcessedAt, Reason: e.Reason})
	case EffectWebhook:
		return json.Marshal(webhookEffect{Kind: e.Kind, EndpointID: e.EndpointID, EventID: e.EventID, State: e.State,
			Attempts: e.Attempts, LastStatus: e.LastStatus})
	default:
		return nil, fmt.Errorf("marshal effect: unknown kind %q", e.Kind)
	}
}

const (
	// The operation's events: those still in the outbox, and those the
	// cleanup deleted, which the record keeps (cleaned_events, migration
	// 00008), in outbox order. The created_at bounds: a key executed
	// again after it was forgotten lists only the events of its current
	// operation. One statement, so one snapshot: an event moving from the
	// outbox to the record meanwhile is seen exactly once.
	sqlOperationEvents = `SELECT id, type, published_at, stream_seq FROM (
		SELECT seq, id, type, published_at, stream_seq FROM outbox_events
		WHERE tenant = $1 AND operation_key = $2 AND created_at >= $3
		UNION ALL
		SELECT (k->>'seq')::bigint, (k->>'id')::uuid, k->>'type', (k->>'published_at')::timestamptz, (k->>'stream_seq')::bigint
		FROM operations o CROSS JOIN LATERAL jsonb_array_elements(o.cleaned_events) AS k
		WHERE o.tenant = $1 AND o.key = $2 AND o.created_at = $3
	) ev ORDER BY seq`

	// The delete of rec: the note it deleted carries its time.
	sqlOperationDeleted = `SELECT EXISTS (SELECT 1 FROM notes WHERE tenant = $1 AND id = $2 AND deleted_at = $3)`

	sqlOperationAttachment = `SELECT id, status, processed_at, coalesce(reason, '') FROM attachments
	WHERE tenant = $1 AND note_id = $2`

	// The webhook deliveries of the operation's events (the dispatcher's
	// table, read only here), in the order they were recorded.
	sqlOperationWebhooks = `SELECT endpoint_id, event_id, state, attempts, last_status FROM webhook_deliveries
	WHERE tenant = $1 AND event_id = ANY ($2) ORDER BY id`
)

// Lookup answers what became of the operation (tenant, key). While a request
// with the key is executing it answers state in_progress, never
// ErrOperationNotFound: the lookup takes the key's advisory lock, so either
// it sees the committed record or it knows whether someone holds the lock.
// Lookups take the lock shared, so concurrent lookups never see each other
// as an executing request.
// Errors: ErrOperationNotFound, *idempotency.UnavailableError.
func (s *Service) Lookup(ctx context.Context, tenant, key string) (*Operation, error) {
	var (
		locked bool
		rec    *idempotency.Record
		op     *Operation
	)
	conn, err := s.acquire(ctx, tenant)
	if err != nil {
		return nil, readErr("look up operation", err)
	}
	defer conn.Release()
	err = db.WithTx(ctx, conn, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		idempotency.QueueProbe(b, tenant, key, &locked, &rec)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if rec != nil && !s.clock().Before(rec.ForgetAt) {
			rec = nil // forgotten: the key retention has passed
		}
		if rec == nil {
			return nil
		}
		var err error
		op, err = s.describe(ctx, tx, rec)
		return err
	})
	if err != nil {
		return nil, readErr("look up operation", err)
	}
	if op != nil {
		return op, nil
	}
	if locked {
		return nil, ErrOperationNotFound
	}
	op = &Operation{Key: key, State: contract.OperationInProgress, Effects: []Effect{}}
	if action, ok := s.proto.Executing(tenant, key); ok {
		op.Action = &action
	}
	return op, nil
}

func (s *Service) describe(ctx context.Context, tx pgx.Tx, rec *idempotency.Record) (*Operation, error) {
	str := func(t time.Time) *string { v := FormatTime(t); return &v }
	op := &Operation{Key: rec.Key, Action: &rec.Action, State: contract.OperationCompleted,
		CreatedAt: str(rec.CreatedAt), CompletedAt: str(rec.CompletedAt), ExpiresAt: str(rec.ExpiresAt),
		Effects: []Effect{}}
	if rec.Resource != "" {
		op.Resource = &rec.Resource
	}
	if !rec.Expired(s.clock()) {
		op.Response = &Response{Outcome: rec.Outcome, Body: jsontext.Value(rec.Body)}
	}
	rows, err := tx.Query(ctx, sqlOperationEvents, rec.Tenant, rec.Key, rec.CreatedAt)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var (
			id        uuid.UUID
			typ       string
			published *time.Time
			seq       *int64
		)
		if err := rows.Scan(&id, &typ, &published, &seq); err != nil {
			rows.Close()
			return nil, err
		}
		e := Effect{Kind: EffectEvent, ID: id.String(), Type: contract.CloudEventType(typ), State: EventPending}
		if published != nil {
			e.State = EventPublished
			e.PublishedAt = str(*published)
			e.StreamSeq = seq
		}
		op.Effects = append(op.Effects, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(op.Effects) == 0 {
		typ, err := forgottenEvent(ctx, tx, rec)
		if err != nil {
			return nil, err
		}
		if typ != "" {
			op.Effects = append(op.Effects, Effect{Kind: EffectEvent, Type: contract.CloudEventType(typ), State: EventForgotten})
		}
	}
	if err := webhookEffects(ctx, tx, rec.Tenant, op); err != nil {
		return nil, err
	}
	// Every recorded create created its note: a create that fails is not
	// recorded.
	if rest, ok := contract.ParseNotePath(rec.Resource); ok && rec.Action == contract.ActionCreateNote {
		noteID, err := uuid.Parse(rest)
		if err != nil {
			return op, nil
		}
		var (
			id            uuid.UUID
			state, reason string
			processed     *time.Time
		)
		err = tx.QueryRow(ctx, sqlOperationAttachment, rec.Tenant, pgUUID(noteID)).Scan(&id, &state, &processed, &reason)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return nil, err
		default:
			e := Effect{Kind: EffectAttachment, ID: id.String(), State: state, Reason: reason}
			if processed != nil {
				e.ProcessedAt = str(*processed)
			}
			op.Effects = append(op.Effects, e)
		}
	}
	return op, nil
}

// webhookEffects appends to op the webhook deliveries of its events.
func webhookEffects(ctx context.Context, tx pgx.Tx, tenant string, op *Operation) error {
	var ids []string
	for _, e := range op.Effects {
		if e.Kind == EffectEvent && e.ID != "" {
			ids = append(ids, e.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, sqlOperationWebhooks, tenant, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var endpoint, event uuid.UUID
		e := Effect{Kind: EffectWebhook}
		if err := rows.Scan(&endpoint, &event, &e.State, &e.Attempts, &e.LastStatus); err != nil {
			return err
		}
		e.EndpointID, e.EventID = endpoint.String(), event.String()
		op.Effects = append(op.Effects, e)
	}
	return rows.Err()
}

// forgottenEvent returns the type of the event that rec's operation wrote
// when neither the outbox nor the record has it any more, or "" when the
// operation wrote none. Migration 00008 makes the record keep every event
// the cleanup deletes; this covers those deleted before it (and by hand),
// so that the lookup never answers an empty list for an operation that had
// an effect. A create always wrote one note.created; a delete wrote one
// note.deleted when it deleted the note, which then carries the
// operation's time (a delete that found nothing wrote none).
func forgottenEvent(ctx context.Context, tx pgx.Tx, rec *idempotency.Record) (string, error) {
	rest, ok := contract.ParseNotePath(rec.Resource)
	if !ok {
		return "", nil
	}
	noteID, err := uuid.Parse(rest)
	if err != nil {
		return "", nil
	}
	switch rec.Action {
	case contract.ActionCreateNote:
		return contract.EventNoteCreated, nil
	case contract.ActionUpdateNote:
		// Updates are younger than migration 00008 and their outcome says
		// whether they wrote an event; this covers a row lost by hand.
		if rec.Outcome == OutcomeUpdated {
			return contract.EventNoteUpdated, nil
		}
	case contract.ActionDeleteNote:
		var deleted bool
		if err := tx.QueryRow(ctx, sqlOperationDeleted, rec.Tenant, pgUUID(noteID), rec.CreatedAt).Scan(&deleted); err != nil {
			return "", err
		}
		if deleted {
			return contract.EventNoteDeleted, nil
		}
	}
	return "", nil
}
