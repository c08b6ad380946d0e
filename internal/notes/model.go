// Package notes is Quill's notes domain: the note and attachment types, the
// validation of create requests, each write's rules — its parameters'
// fingerprint, what it reads, the rows and events it writes, its outcome —
// given to the idempotency protocol (idempotency.Protocol) as a plan, plus
// the reads and the outcome lookup. It speaks no HTTP: a write returns
// domain errors and records its outcome and the body its caller's Render
// produced.
//
// It owns the notes and attachments tables: no other package writes them.
// The attachment worker stores its results through
// QueueAttachmentsProcessed and QueueAttachmentSkipped, in its own
// transaction.
package notes

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"

	"github.com/quillhq/quill/internal/outbox"

	"github.com/quillhq/quill/internal/validation"
)

// Limits of a note's fields (SPEC §3).
const (
	MaxTitleChars       = 200
	MaxBodyChars        = 65536
	MaxFilenameChars    = 255
	MaxContentTypeBytes = 255
)

// Attachment states.
const (
	AttachmentPending   = "pending"
	AttachmentProcessed = "processed"
	AttachmentFailed    = "failed"
)

// Note is a stored note.
type Note struct {
	ID         uuid.UUID
	Tenant     string
	Title      string
	Body       string
	CreatedAt  time.Time
	DeletedAt  *time.Time
	Attachment *Attachment
	// Version is 1 at creation and one more for each accepted update
	// that changed the note (decision 0078).
	Version int
	// UpdatedAt is when the note last changed; CreatedAt until then.
	UpdatedAt time.Time
}

// Attachment is a note's attachment and its processing state.
type Attachment struct {
	ID          uuid.UUID
	NoteID      uuid.UUID
	Filename    string
	ContentType string
	Size        int
	SHA256      string
	Status      string
	Result      jsontext.Value
	Reason      string
	ProcessedAt *time.Time
}

// NoteView is a note as the API and events show it.
type NoteView struct {
	ID         string          `json:"id"`
	Title      string          `json:"title"`
	Body       string          `json:"body"`
	CreatedAt  string          `json:"created_at"`
	Attachment *AttachmentView `json:"attachment"`
	Version    int             `json:"version"`
	UpdatedAt  string          `json:"updated_at"`
}

// AttachmentView is an attachment inside a NoteView.
type AttachmentView struct {
	ID          string `json:"id"`
	Filename    string `json:"filename"`
	ContentType string `json:"content_type"`
	Size        int    `json:"size"`
	SHA256      string `json:"sha256"`
	Status      string `json:"status"`
}

// AttachmentDetail is GET /v1/notes/{id}/attachment: the metadata with the
// processing result, or the reason it failed.
type AttachmentDetail struct {
	AttachmentView
	NoteID      string         `json:"note_id"`
	Result      jsontext.Value `json:"result,omitempty"`
	Reason      string         `json:"reason,omitempty"`
	ProcessedAt *string        `json:"processed_at"`
}

// FormatTime writes t as Quill does everywhere: RFC 3339 UTC, microseconds.
func FormatTime(t time.Time) string {
	var b [len(outbox.TimeFormat)]byte
	return string(outbox.AppendTime(b[:0], t))
}

// View returns the API representation of n.
func (n *Note) View() NoteView {
	v := NoteView{ID: n.ID.String(), Title: n.Title, Body: n.Body, CreatedAt: FormatTime(n.CreatedAt), Version: n.Version}
	if n.UpdatedAt.Equal(n.CreatedAt) {
		v.UpdatedAt = v.CreatedAt // a new note's: formatted once
	} else {
		v.UpdatedAt = FormatTime(n.UpdatedAt)
	}
	if a := n.Attachment; a != nil {
		av := a.View()
		v.Attachment = &av
	}
	return v
}

// AppendJSON appends v as JSON, byte for byte what json.Marshal gives for
// it (TestNoteViewAppendJSON), without reflection: a create renders its
// note once, and its answer, its record and its note.created event share
// those bytes (issue 29). It fails, as marshaling does, on a string that
// is not valid UTF-8.
func (v *NoteView) AppendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"id":`...)
	if dst, err = jsontext.AppendQuote(dst, v.ID); err != nil {
		return nil, fmt.Errorf("note id: %w", err)
	}
	dst = append(dst, `,"title":`...)
	if dst, err = jsontext.AppendQuote(dst, v.Title); err != nil {
		return nil, fmt.Errorf("note title: %w", err)
	}
	dst = append(dst, `,"body":`...)
	if dst, err = jsontext.AppendQuote(dst, v.Body); err != nil {
		return nil, fmt.Errorf("note body: %w", err)
	}
	dst = append(dst, `,"created_at":`...)
	if dst, err = jsontext.AppendQuote(dst, v.CreatedAt); err != nil {
		return nil, fmt.Errorf("note created_at: %w", err)
	}
	dst = append(dst, `,"attachment":`...)
	if v.Attachment == nil {
		dst = append(dst, "null"...)
	} else if dst, err = v.Attachment.AppendJSON(dst); err != nil {
		return nil, err
	}
	dst = append(dst, `,"version":`...)
	dst = strconv.AppendInt(dst, int64(v.Version), 10)
	dst = append(dst, `,"updated_at":`...)
	if dst, err = jsontext.AppendQuote(dst, v.UpdatedAt); err != nil {
		return nil, fmt.Errorf("note updated_at: %w", err)
	}
	return append(dst, '}'), nil
}

// jsonSize is how many bytes v's JSON takes when its strings need no
// escapes, with room for a few: what a create's render buffer is made
// with, so that it is not grown (and a copy thrown away) on the way.
func (v *NoteView) jsonSize() int {
	// {"id":"<36>","title":"","body":"","created_at":"<27>",
	// "attachment":null,"version":<n>,"updated_at":"<27>"} is 182 bytes
	// around the title and the body at a one-digit version.
	n := 208 + len(v.Title) + len(v.Body)
	if a := v.Attachment; a != nil {
		// {"id":"<36>","filename":"","content_type":"","size":<n>,
		// "sha256":"<64>","status":"pending"} is 190 bytes at a
		// one-digit size.
		n += 224 + len(a.Filename) + len(a.ContentType)
	}
	return n
}

// AppendJSON appends a as JSON, as NoteView.AppendJSON does.
func (a *AttachmentView) AppendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"id":`...)
	if dst, err = jsontext.AppendQuote(dst, a.ID); err != nil {
		return nil, fmt.Errorf("attachment id: %w", err)
	}
	dst = append(dst, `,"filename":`...)
	if dst, err = jsontext.AppendQuote(dst, a.Filename); err != nil {
		return nil, fmt.Errorf("attachment filename: %w", err)
	}
	dst = append(dst, `,"content_type":`...)
	if dst, err = jsontext.AppendQuote(dst, a.ContentType); err != nil {
		return nil, fmt.Errorf("attachment content_type: %w", err)
	}
	dst = append(dst, `,"size":`...)
	dst = strconv.AppendInt(dst, int64(a.Size), 10)
	dst = append(dst, `,"sha256":`...)
	if dst, err = jsontext.AppendQuote(dst, a.SHA256); err != nil {
		return nil, fmt.Errorf("attachment sha256: %w", err)
	}
	dst = append(dst, `,"status":`...)
	if dst, err = jsontext.AppendQuote(dst, a.Status); err != nil {
		return nil, fmt.Errorf("attachment status: %w", err)
	}
	return append(dst, '}'), nil
}

// View returns the metadata representation of a.
func (a *Attachment) View() AttachmentView {
	return AttachmentView{ID: a.ID.String(), Filename: a.Filename, ContentType: a.ContentType,
		Size: a.Size, SHA256: a.SHA256, Status: a.Status}
}

// Detail returns the attachment's metadata with its processing outcome.
func (a *Attachment) Detail() AttachmentDetail {
	d := AttachmentDetail{AttachmentView: a.View(), NoteID: a.NoteID.String(), Reason: a.Reason}
	if a.Status == AttachmentProcessed {
		d.Result = a.Result
	}
	if a.ProcessedAt != nil {
		s := FormatTime(*a.ProcessedAt)
		d.ProcessedAt = &s
	}
	return d
}

// CreateInput is the body of a create request as sent. Pointers tell an
// absent (or null) member from an empty one.
type CreateInput struct {
	Title      *string          `json:"title"`
	Body       *string          `json:"body"`
	Attachment *AttachmentInput `json:"attachment"`
}

// AttachmentInput is the attachment member of a create request.
type AttachmentInput struct {
	Filename    *string `json:"filename"`
	ContentType *string `json:"content_type"`
	Data        *string `json:"data"`
}

// CreateParams are a create request's validated, defaulted parameters.
type CreateParams struct {
	Title      string
	Body       string
	Attachment *NewAttachment
}

// NewAttachment is a validated attachment with its decoded bytes.
type NewAttachment struct {
	Filename    string
	ContentType string
	Data        []byte
	SHA256      string
}

// FieldError names one invalid field of a request (validation.FieldError).
type FieldError = validation.FieldError

// ValidationError lists every invalid field of a request
// (validation.Error, the one type the API renders).
type ValidationError = validation.Error

// requiredText checks that the text field v is present, not empty and at
// most limit characters long, and returns it ("" when absent).
func requiredText(e *ValidationError, field string, v *string, limit int) string {
	if v == nil {
		e.Add(field, "is required")
		return ""
	}
	switch n := utf8.RuneCountInString(*v); {
	case n == 0:
		e.Add(field, "must not be empty")
	case n > limit:
		e.Add(field, "is %d characters long, the limit is %d", n, limit)
	}
	return *v
}

// checkTitle checks a note's title (SPEC §3): present, 1–MaxTitleChars code
// points, no control characters. It returns the title ("" when absent).
func checkTitle(e *ValidationError, v *string) string {
	t := requiredText(e, "title", v, MaxTitleChars)
	if v != nil {
		if i := indexControl(t); i >= 0 {
			e.Add("title", "must not contain control characters (character %d)", i+1)
		}
	}
	return t
}

// checkBody checks a note's body (SPEC §3): up to MaxBodyChars, no U+0000.
func checkBody(e *ValidationError, b string) {
	if n := utf8.RuneCountInString(b); n > MaxBodyChars {
		e.Add("body", "is %d characters long, the limit is %d", n, MaxBodyChars)
	}
	if strings.IndexByte(b, 0) >= 0 {
		e.Add("body", "must not contain U+0000")
	}
}

// TooLargeError says a decoded attachment is over the limit.
type TooLargeError struct {
	Size, Limit int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the decoded attachment is %d bytes, the limit is %d", e.Size, e.Limit)
}

// Validate checks in against SPEC §3 and returns its parameters. It returns a
// *ValidationError naming every invalid field, or a *TooLargeError when the
// decoded attachment exceeds maxAttachment bytes.
func Validate(in CreateInput, maxAttachment int) (CreateParams, error) {
	var p CreateParams
	verr := &ValidationError{}
	p.Title = checkTitle(verr, in.Title)
	if in.Body != nil {
		p.Body = *in.Body
		checkBody(verr, p.Body)
	}
	if a := in.Attachment; a != nil {
		att, tooLarge := validateAttachment(a, maxAttachment, verr)
		if tooLarge != nil {
			return CreateParams{}, tooLarge
		}
		p.Attachment = att
	}
	if len(verr.Errors) > 0 {
		return CreateParams{}, verr
	}
	return p, nil
}

func validateAttachment(a *AttachmentInput, limit int, verr *ValidationError) (*NewAttachment, *TooLargeError) {
	var att NewAttachment
	if att.Filename = requiredText(verr, "attachment.filename", a.Filename, MaxFilenameChars); a.Filename != nil {
		if indexControl(att.Filename) >= 0 || strings.ContainsAny(att.Filename, `/\`) {
			verr.Add("attachment.filename", "must not contain control characters, '/' or '\\'")
		}
	}
	if a.ContentType == nil {
		verr.Add("attachment.content_type", "is required")
	} else {
		att.ContentType = *a.ContentType
		if len(att.ContentType) > MaxContentTypeBytes {
			verr.Add("attachment.content_type", "is longer than %d bytes", MaxContentTypeBytes)
		} else if mt, _, err := mime.ParseMediaType(att.ContentType); err != nil || !strings.Contains(mt, "/") {
			verr.Add("attachment.content_type", "is not a media type such as text/plain or image/png")
		}
	}
	if a.Data == nil {
		verr.Add("attachment.data", "is required")
		return &att, nil
	}
	// Go's decoder skips CR and LF even in strict mode; RFC 4648 §3.3 does
	// not allow them, and they would distort the size check below.
	if strings.ContainsAny(*a.Data, "\r\n") {
		verr.Add("attachment.data", "is not standard base64 (RFC 4648 §4, with padding, without line breaks)")
		return &att, nil
	}
	if n := decodedLen(*a.Data); n > limit {
		// Refused before decoding: the size is known from the length.
		return nil, &TooLargeError{Size: n, Limit: limit}
	}
	data, err := base64.StdEncoding.Strict().DecodeString(*a.Data)
	if err != nil {
		verr.Add("attachment.data", "is not standard base64 (RFC 4648 §4, with padding, without line breaks)")
		return &att, nil
	}
	sum := sha256.Sum256(data)
	att.Data = data
	att.SHA256 = hex.EncodeToString(sum[:])
	return &att, nil
}

// decodedLen is the exact decoded size of padded base64 s (for well-formed
// input; malformed input is refused by the decoder afterwards).
func decodedLen(s string) int {
	n := len(s) / 4 * 3
	if strings.HasSuffix(s, "==") {
		n -= 2
	} else if strings.HasSuffix(s, "=") {
		n--
	}
	return max(n, 0)
}

// indexControl returns the character index of the first Unicode Cc
// character in s, or -1.
func indexControl(s string) int {
	i := 0
	for _, r := range s {
		if unicode.Is(unicode.Cc, r) {
			return i
		}
		i++
	}
	return -1
}

// Errors of the notes service.
var (
	// ErrNotFound: no such live note (or attachment) for this tenant.
	ErrNotFound = errors.New("not found")
	// ErrOperationNotFound: nothing with this key is recorded for this
	// tenant and nothing with it is executing.
	ErrOperationNotFound = errors.New("operation not found")
	// ErrNothingToDelete: a delete found no live note with the id; the
	// operation is recorded with this error. It is also an ErrNotFound.
	ErrNothingToDelete = fmt.Errorf("%w: no live note to delete", ErrNotFound)
	// ErrNothingToUpdate: an update found no live note with the id; the
	// operation is recorded with this error. It is also an ErrNotFound.
	ErrNothingToUpdate = fmt.Errorf("%w: no live note to update", ErrNotFound)
)

// VersionMismatchError: the write's If-Match named another version than
// the note's (precondition_failed); the operation is recorded with it.
type VersionMismatchError struct {
	// Expected is the version the request named; Current is the note's.
	Expected, Current int
}

func (e *VersionMismatchError) Error() string {
	return fmt.Sprintf("the note is at version %d, not %d", e.Current, e.Expected)
}
