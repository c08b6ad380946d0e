package worker

import (
	"fmt"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/notes"
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

// parse reads the note.created event ev (of Quill's CloudEvents form,
// checked by the consumer package); an error says why the worker can never
// process it.
func parse(ev consumer.Event) (parsed, error) {
	var p parsed
	var err error
	if want := contract.CloudEventType(contract.EventNoteCreated); ev.Type != want {
		return p, fmt.Errorf("event type %q is not %s", ev.Type, want)
	}
	if p.id, err = uuid.Parse(ev.ID); err != nil {
		return p, fmt.Errorf("event id %q is not a UUID", ev.ID)
	}
	p.tenant, p.time = ev.Tenant, ev.Time
	if p.noteID, err = uuid.Parse(ev.Subject); err != nil {
		return p, fmt.Errorf("event subject %q is not a note id", ev.Subject)
	}
	var data noteCreated
	if err := json.Unmarshal(ev.Data, &data, json.RejectUnknownMembers(false)); err != nil {
		return p, fmt.Errorf("unparseable event: data: %w", err)
	}
	if a := data.Attachment; a != nil {
		id, err := uuid.Parse(a.ID)
		if err != nil {
			return p, fmt.Errorf("attachment id %q is not a UUID", a.ID)
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
