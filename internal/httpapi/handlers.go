package httpapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/problem"
	"github.com/quillhq/quill/internal/webhooks"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		problem.New(http.StatusInternalServerError, contract.CodeInternal, "could not encode the response").Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// operationKey reads the Idempotency-Key header and records its hash for
// the log line.
func operationKey(r *http.Request, action string) (string, *problem.Problem) {
	ri := info(r)
	ri.action = action
	key, err := opkey.ParseHeader(r.Header.Values("Idempotency-Key"))
	switch {
	case errors.Is(err, opkey.ErrMissing):
		return "", problem.New(http.StatusBadRequest, contract.CodeKeyMissing,
			"send Idempotency-Key with a key that names this operation; a retry of the same operation sends the same key")
	case err != nil:
		return "", problem.New(http.StatusBadRequest, contract.CodeKeyInvalid, err.Error())
	}
	ri.keyHash = opkey.Hash(ri.tenant, key)
	return key, nil
}

func (s *server) writeRequest(r *http.Request, key string) notes.Request {
	tp, ts := s.traceContext(r)
	return notes.Request{Tenant: info(r).tenant, Key: key, Wait: preferWait(r), Traceparent: tp, Tracestate: ts, Render: RenderWrite}
}

// RenderWrite renders an executed write's result as the response body the
// notes service records for the operation and replays byte for byte: the
// note for a create, the delete result, the error's problem (see
// problemFor) for a write recorded with an error.
func RenderWrite(res notes.Result) ([]byte, error) {
	switch {
	case res.Err != nil:
		return problemFor(res.Err).JSON(), nil
	case res.NoteJSON != nil:
		return res.NoteJSON, nil
	case res.Note != nil:
		body, err := json.Marshal(res.Note)
		if err != nil {
			return nil, fmt.Errorf("marshal note: %w", err)
		}
		return body, nil
	case res.Deleted != nil:
		body, err := json.Marshal(res.Deleted)
		if err != nil {
			return nil, fmt.Errorf("marshal delete result: %w", err)
		}
		return body, nil
	default:
		return nil, errors.New("render write: the result is empty")
	}
}

// statusOf is the HTTP status of a recorded write outcome (SPEC §3): 201
// for a create, 200 for a delete or an update, 404 for one that found no
// note, 412 for one whose If-Match named another version. An
// outcome this API does not know (a record of a newer version) is a 500.
func statusOf(outcome string) int {
	switch outcome {
	case notes.OutcomeCreated:
		return http.StatusCreated
	case notes.OutcomeDeleted, notes.OutcomeUpdated, notes.OutcomeUnchanged, webhooks.OutcomeRotated:
		return http.StatusOK
	case webhooks.OutcomeNotFound:
		return http.StatusNotFound
	case webhooks.OutcomeLimitReached:
		return http.StatusUnprocessableEntity
	case notes.OutcomeNothingToDelete, notes.OutcomeNothingToUpdate:
		return http.StatusNotFound
	case notes.OutcomeVersionMismatch:
		return http.StatusPreconditionFailed
	default:
		return http.StatusInternalServerError
	}
}

// writeOutcome sends a write's recorded response, or the problem of err:
// the outcome's status, Location for a created note, and the recorded body.
func writeOutcome(w http.ResponseWriter, r *http.Request, out notes.Answer, err error) {
	if err != nil {
		writeError(w, r, err)
		return
	}
	status := statusOf(out.Outcome)
	h := w.Header()
	// The header values are assigned rather than Set: Set makes a slice
	// for each, and a write answers three (issue 29). The content types
	// are shared slices of one value, and Location and ETag are backed by
	// the request's reqInfo, each length equal to capacity so that an Add
	// copies them.
	if status >= 400 {
		h["Content-Type"] = problemContentType
	} else {
		h["Content-Type"] = jsonContentType
	}
	created, versioned := out.Outcome == notes.OutcomeCreated, out.ResourceVersion > 0 && status < 400
	if created || versioned {
		vals := info(r).headers[1:3]
		if created {
			vals[0] = out.Resource
			h["Location"] = vals[0:1:1]
		}
		if versioned {
			vals[1] = etag(out.ResourceVersion)
			h["Etag"] = vals[1:2:2]
		}
	}
	if out.Replayed {
		h.Set("Idempotent-Replayed", "true")
		info(r).replayed = true
	}
	w.WriteHeader(status)
	_, _ = w.Write(out.Body)
}

func (s *server) createNote(w http.ResponseWriter, r *http.Request) {
	key, p := operationKey(r, contract.ActionCreateNote)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	var in notes.CreateInput
	if p := decodeBody(w, r, s.Config.MaxBodyBytes, &in); p != nil {
		writeProblem(w, r, p)
		return
	}
	params, err := notes.Validate(in, s.Config.MaxAttachmentBytes)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out, err := s.Notes.Create(r.Context(), s.writeRequest(r, key), params)
	writeOutcome(w, r, out, err)
}

// keyAndIfMatch reads the operation key and the If-Match version (0: none)
// of a write that acts on a note.
func keyAndIfMatch(r *http.Request, action string) (string, int, *problem.Problem) {
	key, p := operationKey(r, action)
	if p != nil {
		return "", 0, p
	}
	version, p := ifMatch(r)
	return key, version, p
}

func (s *server) updateNote(w http.ResponseWriter, r *http.Request) {
	key, version, p := keyAndIfMatch(r, contract.ActionUpdateNote)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	if version == 0 {
		writeProblem(w, r, problem.New(http.StatusPreconditionRequired, contract.CodePreconditionRequired,
			`an update needs If-Match with the version it is made against, as GET /v1/notes/{id} answered it in ETag (If-Match: "3")`))
		return
	}
	var in notes.UpdateInput
	if p := decodeBody(w, r, s.Config.MaxBodyBytes, &in); p != nil {
		writeProblem(w, r, p)
		return
	}
	params, err := notes.ValidateUpdate(in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	id, ok := parseID(r)
	if !ok {
		writeError(w, r, notes.ErrNotFound)
		return
	}
	req := s.writeRequest(r, key)
	req.IfMatch = version
	out, err := s.Notes.Update(r.Context(), req, id, params)
	writeOutcome(w, r, out, err)
}

func (s *server) deleteNote(w http.ResponseWriter, r *http.Request) {
	key, version, p := keyAndIfMatch(r, contract.ActionDeleteNote)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	if r.ContentLength != 0 {
		// A delete takes no parameters; a body may only be an empty object.
		var empty struct{}
		if p := decodeBody(w, r, s.Config.MaxBodyBytes, &empty); p != nil {
			writeProblem(w, r, p)
			return
		}
	}
	id, ok := parseID(r)
	if !ok {
		writeError(w, r, notes.ErrNotFound)
		return
	}
	req := s.writeRequest(r, key)
	req.IfMatch = version
	out, err := s.Notes.Delete(r.Context(), req, id)
	writeOutcome(w, r, out, err)
}

func (s *server) getNote(w http.ResponseWriter, r *http.Request) {
	if n, ok := readNote(w, r, s.Notes.Get); ok {
		w.Header().Set("ETag", etag(n.Version))
		writeJSON(w, http.StatusOK, n.View())
	}
}

// readNote reads, with read, what belongs to the tenant's note named by the
// path's id. When the id is malformed or read fails it answers the error and
// reports false.
func readNote[T any](w http.ResponseWriter, r *http.Request, read func(ctx context.Context, tenant string, id uuid.UUID) (T, error)) (T, bool) {
	var zero T
	id, ok := parseID(r)
	if !ok {
		writeError(w, r, notes.ErrNotFound)
		return zero, false
	}
	v, err := read(r.Context(), info(r).tenant, id)
	if err != nil {
		writeError(w, r, err)
		return zero, false
	}
	return v, true
}

// List limits.
const (
	defaultListLimit = 50
	maxListLimit     = 100
)

type listPage struct {
	Items      []jsontext.Value `json:"items"`
	NextCursor *string          `json:"next_cursor"`
}

func (s *server) listNotes(w http.ResponseWriter, r *http.Request) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	var errs []problem.FieldError
	if err != nil {
		errs = append(errs, problem.FieldError{Field: "query", Message: "is not a valid URL query: " + err.Error()})
	}
	limit := defaultListLimit
	if v := q.Get("limit"); v != "" || q.Has("limit") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			errs = append(errs, problem.FieldError{Field: "limit", Message: "must be an integer from 1 to 100"})
		}
		limit = n
	}
	var after *uuid.UUID
	if c := q.Get("cursor"); c != "" || q.Has("cursor") {
		id, ok := decodeCursor(c)
		if !ok {
			errs = append(errs, problem.FieldError{Field: "cursor", Message: "is not a cursor returned by this API"})
		}
		after = &id
	}
	if len(errs) > 0 {
		p := problem.New(http.StatusBadRequest, contract.CodeValidation, "the query has invalid parameters; see errors")
		p.Errors = errs
		writeProblem(w, r, p)
		return
	}
	// The service stops reading once the notes hold MaxListBytes of text;
	// the exact cap is on the encoded items, below.
	list, next, err := s.Notes.List(r.Context(), info(r).tenant, limit, after, s.Config.MaxListBytes)
	if err != nil {
		writeError(w, r, err)
		return
	}
	page := listPage{Items: make([]jsontext.Value, 0, len(list))}
	size := 0
	for i, n := range list {
		item, err := json.Marshal(n.View())
		if err != nil {
			writeError(w, r, fmt.Errorf("encode note: %w", err))
			return
		}
		// The page ends before the item that would take it past
		// MaxListBytes, and goes on from the last item it holds; it
		// always holds one, so a client makes progress whatever the
		// cap.
		if size += len(item) + 1; i > 0 && size > s.Config.MaxListBytes {
			id := list[i-1].ID
			next = &id
			break
		}
		page.Items = append(page.Items, item)
	}
	if next != nil {
		c := encodeCursor(*next)
		page.NextCursor = &c
	}
	writeJSON(w, http.StatusOK, page)
}

// Cursors are opaque to clients: the base64url of the last note id seen.
func encodeCursor(id uuid.UUID) string { return base64.RawURLEncoding.EncodeToString(id[:]) }

func decodeCursor(c string) (uuid.UUID, bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) != 16 {
		return uuid.Nil, false
	}
	id, err := uuid.FromBytes(b)
	return id, err == nil
}

func (s *server) getAttachment(w http.ResponseWriter, r *http.Request) {
	if a, ok := readNote(w, r, s.Notes.Attachment); ok {
		writeJSON(w, http.StatusOK, a.Detail())
	}
}

// content is an attachment's bytes as served.
type content struct {
	contentType, filename string
	data                  []byte
}

func (s *server) getAttachmentContent(w http.ResponseWriter, r *http.Request) {
	c, ok := readNote(w, r, func(ctx context.Context, tenant string, id uuid.UUID) (content, error) {
		ct, filename, data, err := s.Notes.AttachmentContent(ctx, tenant, id)
		return content{ct, filename, data}, err
	})
	if ok {
		w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": c.filename}))
		writeBytes(w, r, c.contentType, c.data)
	}
}

func (s *server) getThumbnail(w http.ResponseWriter, r *http.Request) {
	if png, ok := readNote(w, r, s.Notes.Thumbnail); ok {
		writeBytes(w, r, "image/png", png)
	}
}

// writeBytes answers 200 with data as contentType, never sniffed, and
// without the body for HEAD.
func writeBytes(w http.ResponseWriter, r *http.Request, contentType string, data []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(data)
	}
}

func (s *server) getOperation(w http.ResponseWriter, r *http.Request) {
	key, err := opkey.Parse(r.PathValue("key"))
	if err != nil {
		writeProblem(w, r, problem.New(http.StatusBadRequest, contract.CodeKeyInvalid, err.Error()))
		return
	}
	info(r).keyHash = opkey.Hash(info(r).tenant, key)
	op, err := s.Notes.Lookup(r.Context(), info(r).tenant, key)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, operationView(op))
}

// operation is an operation lookup's answer (SPEC §4.6).
type operation struct {
	Key         string         `json:"key"`
	Action      *string        `json:"action"`
	State       string         `json:"state"`
	CreatedAt   *string        `json:"created_at"`
	CompletedAt *string        `json:"completed_at"`
	ExpiresAt   *string        `json:"expires_at"`
	Resource    *string        `json:"resource"`
	Response    *response      `json:"response"`
	Effects     []notes.Effect `json:"effects"`
}

// response is a recorded response as the lookup shows it: the status its
// outcome maps to, and the recorded body.
type response struct {
	Status int            `json:"status"`
	Body   jsontext.Value `json:"body"`
}

func operationView(op *notes.Operation) operation {
	v := operation{Key: op.Key, Action: op.Action, State: op.State, CreatedAt: op.CreatedAt, CompletedAt: op.CompletedAt,
		ExpiresAt: op.ExpiresAt, Resource: op.Resource, Effects: op.Effects}
	if op.Response != nil {
		// A webhook write's record keeps its secret sealed: the lookup
		// shows null there (the write's replay shows the secret).
		v.Response = &response{Status: statusOf(op.Response.Outcome), Body: webhooks.RedactRecorded(op.Response.Body)}
	}
	return v
}

// etag is the ETag of a note at version: a strong tag, the quoted version.
func etag(version int) string {
	if version > 0 && version < len(smallETags) {
		return smallETags[version]
	}
	return `"` + strconv.Itoa(version) + `"`
}

// smallETags are the entity tags of the first versions, made once: every
// create answers "1".
var smallETags = func() []string {
	out := make([]string, 64)
	for v := range out {
		out[v] = `"` + strconv.Itoa(v) + `"`
	}
	return out
}()

// The shared Content-Type values of writeOutcome.
var (
	jsonContentType    = []string{"application/json"}
	problemContentType = []string{problem.ContentType}
)
