package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/deadletter"
	"github.com/quillhq/quill/internal/inbox"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/outbox"
)

// event is the part of a note.created CloudEvent the worker reads.
type event struct {
	SpecVersion string `json:"specversion"`
	ID          string `json:"id"`
	Source      string `json:"source"`
	Type        string `json:"type"`
	Subject     string `json:"subject"`
	Time        string `json:"time"`
	Data        struct {
		ID         string `json:"id"`
		Attachment *struct {
			ID          string `json:"id"`
			SHA256      string `json:"sha256"`
			Size        int    `json:"size"`
			ContentType string `json:"content_type"`
			Filename    string `json:"filename"`
		} `json:"attachment"`
	} `json:"data"`
}

// parsed is a validated note.created event.
type parsed struct {
	id     uuid.UUID
	tenant string
	noteID uuid.UUID
	time   time.Time
	att    *attachmentRef
}

type attachmentRef struct {
	id          uuid.UUID
	sha256      string
	size        int
	contentType string
	filename    string
}

// parse validates a note.created event; every error is permanent.
func parse(payload []byte) (parsed, error) {
	var e event
	if err := json.Unmarshal(payload, &e, json.RejectUnknownMembers(false)); err != nil {
		return parsed{}, &permanentError{"unparseable event: " + err.Error()}
	}
	var p parsed
	var err error
	if p.id, err = uuid.Parse(e.ID); err != nil {
		return p, &permanentError{fmt.Sprintf("event id %q is not a UUID", e.ID)}
	}
	if e.Type != outbox.CloudEventType(outbox.TypeNoteCreated) {
		return p, &permanentError{fmt.Sprintf("event type %q is not %s", e.Type, outbox.CloudEventType(outbox.TypeNoteCreated))}
	}
	tenant, ok := strings.CutPrefix(e.Source, "/tenants/")
	if !ok || tenant == "" {
		return p, &permanentError{fmt.Sprintf("event source %q names no tenant", e.Source)}
	}
	p.tenant = tenant
	if p.noteID, err = uuid.Parse(e.Subject); err != nil {
		return p, &permanentError{fmt.Sprintf("event subject %q is not a note id", e.Subject)}
	}
	if p.time, err = time.Parse(time.RFC3339Nano, e.Time); err != nil {
		return p, &permanentError{fmt.Sprintf("event time %q is not RFC 3339", e.Time)}
	}
	if a := e.Data.Attachment; a != nil {
		id, err := uuid.Parse(a.ID)
		if err != nil {
			return p, &permanentError{fmt.Sprintf("attachment id %q is not a UUID", a.ID)}
		}
		p.att = &attachmentRef{id: id, sha256: a.SHA256, size: a.Size, contentType: a.ContentType, filename: a.Filename}
	}
	return p, nil
}

// ProcessedData is the data of an attachment.processed event.
type ProcessedData struct {
	NoteID       string `json:"note_id"`
	AttachmentID string `json:"attachment_id"`
	// State is processed or failed.
	State        string `json:"state"`
	DetectedType string `json:"detected_type,omitempty"`
	Reason       string `json:"reason,omitempty"`
}

// Attachment states the worker writes.
const (
	StateProcessed = "processed"
	StateFailed    = "failed"
)

// ReasonNoteDeleted is the reason recorded on the attachment of a note that
// was deleted before its event was processed; the attachment stays pending.
const ReasonNoteDeleted = "skipped: the note was deleted before processing"

const (
	// The note's row lock orders this transaction's outbox event after
	// every event of the note committed before it, and a concurrent delete
	// after it (see the README's relay section).
	sqlAttachmentLock = `SELECT n.deleted_at IS NOT NULL, a.id, a.status, a.data
	FROM notes n JOIN attachments a ON a.note_id = n.id
	WHERE n.id = $1 AND n.tenant = $2
	FOR UPDATE OF n, a`

	sqlAttachmentDone = `UPDATE attachments SET status = $2, result = $3, reason = nullif($4, ''), thumbnail = $5, processed_at = $6
	WHERE id = $1`

	sqlAttachmentSkipped = `UPDATE attachments SET reason = $2 WHERE id = $1 AND status = 'pending'`
)

func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// process handles one delivery: parse, then one transaction, then the
// notification and the metrics. It returns nil only after the commit (or
// when there is nothing to commit); the caller's nil is the acknowledgement.
func (w *Worker) process(ctx context.Context, msg *message.Message) error {
	p, err := parse(msg.Payload)
	if err != nil {
		return err
	}
	msg.Metadata.Set(deadletter.MetaEventID, p.id.String())
	if h := w.hooks.BeforeProcess; h != nil {
		n := 0
		fmt.Sscan(msg.Metadata.Get(deadletter.MetaDeliveries), &n)
		if err := h(p.id.String(), n); err != nil {
			return err
		}
	}
	if p.att == nil {
		// Nothing to process; nothing to remember either.
		w.m.Message(metrics.WorkerSkipped)
		return nil
	}
	var result string
	var committed time.Time
	err = db.WithTx(ctx, w.pool, func(tx pgx.Tx) error {
		result, err = w.transact(ctx, tx, msg, p)
		return err
	})
	if err != nil {
		return fmt.Errorf("event %s: %w", p.id, err)
	}
	committed = w.now()
	if result == metrics.WorkerProcessed || result == metrics.WorkerFailed {
		w.notifier.Signal()
		w.m.EndToEnd.Observe(committed.Sub(p.time).Seconds())
	}
	w.m.Message(result)
	w.log.Debug().Str("event_id", p.id.String()).Str("tenant", p.tenant).Str("note_id", p.noteID.String()).
		Str("result", result).Msg("event handled")
	if h := w.hooks.AfterCommit; h != nil {
		if err := h(p.id.String()); err != nil {
			return err
		}
	}
	return nil
}

// transact is the transaction of one event; it returns the metrics result.
func (w *Worker) transact(ctx context.Context, tx pgx.Tx, msg *message.Message, p parsed) (string, error) {
	now := w.now().UTC().Truncate(time.Microsecond)
	fresh, err := inbox.Insert(ctx, tx, w.cfg.Consumer, p.id, now)
	if err != nil {
		return "", db.Translate(err)
	}
	if !fresh {
		return metrics.WorkerDuplicate, nil
	}
	var deleted bool
	var attID pgtype.UUID
	var status string
	var data []byte
	err = tx.QueryRow(ctx, sqlAttachmentLock, pgUUID(p.noteID), p.tenant).Scan(&deleted, &attID, &status, &data)
	if errors.Is(err, pgx.ErrNoRows) {
		// Notes are never removed (only marked deleted), so the event
		// belongs to another database: nothing here can ever process it.
		return "", &permanentError{fmt.Sprintf("note %s of tenant %s has no attachment in this database", p.noteID, p.tenant)}
	}
	if err != nil {
		return "", fmt.Errorf("lock attachment: %w", db.Translate(err))
	}
	switch {
	case deleted:
		if _, err := tx.Exec(ctx, sqlAttachmentSkipped, attID, ReasonNoteDeleted); err != nil {
			return "", fmt.Errorf("record skip: %w", db.Translate(err))
		}
		return metrics.WorkerSkipped, nil
	case status != "pending":
		// Processed under another event id, or before the inbox forgot
		// this one: the effect exists, do not repeat it.
		return metrics.WorkerDuplicate, nil
	}
	res, perr := attachment.Process(attachment.Input{ContentType: p.att.contentType, Filename: p.att.filename,
		Size: p.att.size, SHA256: p.att.sha256, Data: data}, w.cfg.Limits)
	var permanent *attachment.PermanentError
	data = nil
	ev := ProcessedData{NoteID: p.noteID.String(), AttachmentID: uuid.UUID(attID.Bytes).String()}
	var resultJSON []byte
	var thumb []byte
	switch {
	case errors.As(perr, &permanent):
		ev.State, ev.Reason = StateFailed, permanent.Reason
	case perr != nil:
		return "", fmt.Errorf("process attachment: %w", perr)
	default:
		ev.State, ev.DetectedType = StateProcessed, res.DetectedType
		if resultJSON, err = res.JSON(); err != nil {
			return "", err
		}
		if res.Thumbnail != nil {
			thumb = res.Thumbnail.PNG
		}
	}
	if _, err := tx.Exec(ctx, sqlAttachmentDone, attID, ev.State, resultJSON, ev.Reason, thumb, now); err != nil {
		return "", fmt.Errorf("store result: %w", db.Translate(err))
	}
	eid, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("new event id: %w", err)
	}
	if err := outbox.Insert(ctx, tx, outbox.Event{ID: eid, Tenant: p.tenant, AggregateID: p.noteID,
		Type: outbox.TypeAttachmentProcessed, Time: now, Data: ev, Traceparent: msgTraceparent(msg)}); err != nil {
		return "", db.Translate(err)
	}
	if ev.State == StateFailed {
		return metrics.WorkerFailed, nil
	}
	return metrics.WorkerProcessed, nil
}

func msgTraceparent(msg *message.Message) string {
	var h map[string][]string
	if s := msg.Metadata.Get(deadletter.MetaHeaders); s != "" && json.Unmarshal([]byte(s), &h) == nil {
		if v := h["traceparent"]; len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
