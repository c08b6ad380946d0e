package worker

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-json-experiment/json"
	"github.com/google/uuid"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/deadletter"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
)

// noteCreated is the part of a note.created event's data the worker reads.
type noteCreated struct {
	ID         string `json:"id"`
	Attachment *struct {
		ID          string `json:"id"`
		SHA256      string `json:"sha256"`
		Size        int    `json:"size"`
		ContentType string `json:"content_type"`
		Filename    string `json:"filename"`
	} `json:"attachment"`
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
	var e outbox.CloudEvent
	var data noteCreated
	if err := json.Unmarshal(payload, &e, json.RejectUnknownMembers(false)); err != nil {
		return parsed{}, &permanentError{"unparseable event: " + err.Error()}
	}
	if len(e.Data) > 0 {
		if err := json.Unmarshal(e.Data, &data, json.RejectUnknownMembers(false)); err != nil {
			return parsed{}, &permanentError{"unparseable event: data: " + err.Error()}
		}
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
	if a := data.Attachment; a != nil {
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
	StateProcessed = notes.AttachmentProcessed
	StateFailed    = notes.AttachmentFailed
)

// ReasonNoteDeleted is the reason recorded on the attachment of a note that
// was deleted before its event was processed; the attachment stays pending.
const ReasonNoteDeleted = "skipped: the note was deleted before processing"

// process handles one delivery: parse, then the group commit of its
// transaction (see commit.go), then the notification and the metrics. It
// returns nil only after the commit (or when there is nothing to commit);
// the caller's nil is the acknowledgement.
func (w *Worker) process(msg *message.Message) error {
	p, err := parse(msg.Payload)
	if err != nil {
		return err
	}
	msg.Metadata.Set(deadletter.MetaEventID, p.id.String())
	if err := w.checkTenant(p, msg.Metadata.Get(deadletter.MetaSubject)); err != nil {
		return err
	}
	deliveries, _ := strconv.Atoi(msg.Metadata.Get(deadletter.MetaDeliveries))
	if h := w.hooks.BeforeProcess; h != nil {
		if err := h(p.id.String(), deliveries); err != nil {
			return err
		}
	}
	if p.att == nil {
		// Nothing to process; nothing to remember either.
		w.m.Message(metrics.WorkerSkipped)
		return nil
	}
	o := w.commit.submit(&job{p: p, deliveries: deliveries, trace: msgTraceparent(msg), done: make(chan outcome, 1)})
	if o.err != nil {
		return fmt.Errorf("event %s: %w", p.id, o.err)
	}
	if o.result == metrics.WorkerProcessed || o.result == metrics.WorkerFailed {
		w.notifier.Signal()
		w.m.EndToEnd.Observe(o.committed.Sub(p.time).Seconds())
	}
	w.m.Message(o.result)
	w.log.Debug().Str("event_id", p.id.String()).Str("tenant", p.tenant).Str("note_id", p.noteID.String()).
		Str("result", o.result).Msg("event handled")
	if h := w.hooks.AfterCommit; h != nil {
		if err := h(p.id.String()); err != nil {
			return err
		}
	}
	return nil
}

// checkTenant refuses, for good, an event whose tenant is not a tenant name
// or not the tenant of the subject it was delivered on: the subject is
// what the stream's per-tenant limits and filters saw, and a tenant name
// is what the queries and subjects the worker builds from it expect.
func (w *Worker) checkTenant(p parsed, subject string) error {
	if !auth.ValidTenant(p.tenant) {
		return &permanentError{fmt.Sprintf("event source names tenant %q, which is not a valid tenant name", truncate(p.tenant, 80))}
	}
	if st := stream.Tenant(w.cfg.Stream.SubjectPrefix, subject); st != p.tenant {
		return &permanentError{fmt.Sprintf("event of tenant %q delivered on subject %q, whose tenant is %q", p.tenant, truncate(subject, 200), st)}
	}
	return nil
}

// truncate cuts s to at most n bytes, for quoting a hostile value.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
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
