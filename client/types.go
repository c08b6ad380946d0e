package client

import (
	"encoding/json"
	"fmt"
	"time"
)

// Note is a stored note, as the API answers it.
type Note struct {
	ID         string      `json:"id"`
	Title      string      `json:"title"`
	Body       string      `json:"body"`
	CreatedAt  time.Time   `json:"created_at"`
	Attachment *Attachment `json:"attachment"`
	// Version is 1 when the note is created and one more for each update
	// that changed it: the version UpdateNote's ifVersion names (0 from a
	// server older than edits).
	Version int `json:"version"`
	// UpdatedAt is when the note last changed; CreatedAt until then.
	UpdatedAt time.Time `json:"updated_at"`
}

// Attachment is a note's attachment metadata.
type Attachment struct {
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"content_type"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
	Status      string `json:"status"`
}

// NewNote is what CreateNote sends.
type NewNote struct {
	Title string `json:"title"`
	// Body is optional; empty equals omitted.
	Body string `json:"body,omitempty"`
	// Attachment is optional.
	Attachment *NewAttachment `json:"attachment,omitempty"`
}

// NewAttachment is an attachment to upload with a new note. Data is the raw
// bytes; the client encodes them as standard base64 on the wire.
type NewAttachment struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type"`
	Data        []byte `json:"data"` // encoding/json writes []byte as standard base64
}

// NoteUpdate is what UpdateNote changes: each field that is set (not nil)
// is given that value, the others keep theirs. At least one must be set.
// A Title is validated as a new note's; an empty Body clears the body.
type NoteUpdate struct {
	Title *string `json:"title,omitempty"`
	Body  *string `json:"body,omitempty"`
}

// Deletion is the API's answer to a delete.
type Deletion struct {
	ID        string    `json:"id"`
	DeletedAt time.Time `json:"deleted_at"`
}

// NoteList is one page of notes, newest first.
type NoteList struct {
	Items []Note `json:"items"`
	// NextCursor is empty on the last page.
	NextCursor string `json:"next_cursor"`
}

// Operation is the API's outcome lookup of one operation key (SPEC §4.6).
type Operation struct {
	Key string `json:"key"`
	// Action is one of contract.Actions (a note's or a webhook
	// endpoint's write).
	Action string `json:"action"`
	// State is contract.OperationCompleted or
	// contract.OperationInProgress.
	State       string             `json:"state"`
	CreatedAt   *time.Time         `json:"created_at"`
	CompletedAt *time.Time         `json:"completed_at"`
	ExpiresAt   *time.Time         `json:"expires_at"`
	Resource    string             `json:"resource,omitempty"`
	Response    *OperationResponse `json:"response"`
	Effects     []Effect           `json:"effects"`
	// Raw is the lookup's body exactly as the API sent it.
	Raw json.RawMessage `json:"-"`
}

// OperationResponse is the response recorded for a completed operation.
type OperationResponse struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// Effect is one downstream effect of an operation: an outbox event
// (Kind EffectEvent), an attachment's processing (EffectAttachment) or the
// delivery of one of its events to a webhook endpoint (EffectWebhook: SPEC
// §11, with EndpointID, EventID, Attempts and LastStatus, and no ID). The
// API sends published_at and stream_seq with every event and processed_at
// with every attachment, null while the effect is pending (SPEC §4.6): the
// pointers are nil then. An event stays
// listed, as published, after the outbox cleanup deleted it, for as long
// as the key is remembered; one whose row was lost otherwise has State
// "forgotten", an empty ID and nil PublishedAt and StreamSeq.
type Effect struct {
	Kind string `json:"kind"`
	// ID is the event's (its CloudEvents id) or the attachment's; empty
	// for a forgotten event.
	ID    string `json:"id"`
	Type  string `json:"type,omitempty"`
	State string `json:"state"`
	// PublishedAt and StreamSeq: an event's; nil while it is pending.
	PublishedAt *time.Time `json:"published_at,omitempty"`
	StreamSeq   *int64     `json:"stream_seq,omitempty"`
	// ProcessedAt: an attachment's; nil while it is pending.
	ProcessedAt *time.Time `json:"processed_at,omitempty"`
	// Reason says why an attachment failed, or why one stays pending for
	// good (its note was deleted before it was processed).
	Reason string `json:"reason,omitempty"`
	// EndpointID and EventID: a webhook delivery's endpoint and the event
	// it carries (its webhook-id). Its State is DeliveryPending,
	// DeliveryDelivered or DeliveryFailed.
	EndpointID string `json:"endpoint_id,omitempty"`
	EventID    string `json:"event_id,omitempty"`
	// Attempts: a webhook delivery's POSTs so far (0 again after an
	// operator re-sent a failed one).
	Attempts int `json:"attempts,omitempty"`
	// LastStatus: the HTTP status of a webhook delivery's last answer;
	// nil before any answer, and after a timeout or a refused connection.
	LastStatus *int `json:"last_status,omitempty"`
}

// FieldError names one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Problem is an RFC 9457 problem document the API answered. It is an error.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Code is one of contract's Code constants (SPEC §3).
	Code string `json:"code"`
	// Retry is the advice: contract.RetrySameKey, contract.RetryAfterFixing or
	// contract.RetryNo.
	Retry    string       `json:"retry"`
	Errors   []FieldError `json:"errors,omitempty"`
	Fields   []string     `json:"fields,omitempty"`
	Resource string       `json:"resource,omitempty"`
	// CurrentVersion is the note's version when a write's If-Match named
	// another one (412 precondition_failed): read the note again and
	// decide, never resend the write under a new key.
	CurrentVersion int `json:"current_version,omitempty"`
	// RetryAfter is the Retry-After header's delay, when one was sent.
	RetryAfter time.Duration `json:"-"`
}

func (p *Problem) Error() string {
	msg := fmt.Sprintf("%d %s", p.Status, p.Code)
	if p.Code == "" {
		msg = fmt.Sprintf("HTTP %d", p.Status)
	}
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	for _, f := range p.Errors {
		msg += fmt.Sprintf("; %s: %s", f.Field, f.Message)
	}
	if len(p.Fields) > 0 {
		msg += fmt.Sprintf(" (fields: %v)", p.Fields)
	}
	if p.CurrentVersion > 0 {
		msg += fmt.Sprintf(" (current version: %d)", p.CurrentVersion)
	}
	return msg
}

// Write is what every write returns besides its resource: the operation's
// key and how the answer came.
type Write struct {
	// Key is the operation key the write was sent under.
	Key string
	// Replayed is true when the answer is the recorded one of an earlier
	// delivery (Idempotent-Replayed: true, or recovered by lookup).
	Replayed bool
	// Attempts is the number of requests sent.
	Attempts int
	// Version is the version of the note the answer's ETag names: the
	// note's after a create or an update, the one the delete made (its
	// last version plus one) after a delete. 0 when the answer had no
	// ETag: a server older than edits, or, for a delete, an answer
	// recovered by looking the key up (a lookup records bodies, not
	// headers; a note's own Version says it for the others).
	Version int
}

// Created is CreateNote's answer.
type Created struct {
	Write
	Note Note
}

// Updated is UpdateNote's answer. Note.Version is the ifVersion sent when
// the update changed nothing (the note already had those values).
type Updated struct {
	Write
	Note Note
}

// Deleted is DeleteNote's answer.
type Deleted struct {
	Write
	Deletion Deletion
}
