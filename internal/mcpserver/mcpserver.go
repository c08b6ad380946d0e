// Package mcpserver exposes Quill to AI agents as an MCP server: the tools
// create_note, update_note, delete_note, get_note, get_operation and
// list_operations (SPEC §10), and the read-only list_webhooks and
// get_webhook (webhook endpoints have no write tool: their answers carry
// a signing secret), each backed by the Go client, so that every write keeps one
// operation key across retries, is journalled when the client has a
// journal, and reports an unknown outcome as a state to look up rather than
// a failure to retry.
//
// The key of a write lives in the model's context only once the model has
// seen a result; a call the host cancels or times out, or a restart of the
// server, loses it. So the journal is the server's memory too: at start-up
// the unsettled operations are resumed (Server.Resume), and a create_note
// without a key whose parameters equal those of an unsettled journalled
// operation, or of one the start-up resume finished, answers that
// operation instead of writing again, unless it passes new_intent (decision
// 0049). ServeHTTP serves the same tools over MCP's streamable HTTP
// transport, one client and journal per caller's token.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
)

// Write states, as the CLI prints them.
const (
	StateCompleted = "completed"
	StateRefused   = "refused"
	StateUnknown   = "unknown"
)

// CreateNoteInput is create_note's arguments.
type CreateNoteInput struct {
	Title        string           `json:"title" jsonschema:"the note's title: 1 to 200 characters, no control characters"`
	Body         string           `json:"body,omitempty" jsonschema:"the note's body, up to 65536 characters"`
	Attachment   *AttachmentInput `json:"attachment,omitempty" jsonschema:"an optional file attached to the note"`
	OperationKey string           `json:"operation_key,omitempty" jsonschema:"the operation key of this user request. Omit it on the first call (one is made and returned); pass the returned key again only to retry or finish the SAME request; a new request from the user needs no key or a new one"`
	NewIntent    bool             `json:"new_intent,omitempty" jsonschema:"true only when the user asks for another note identical to one whose create_note has not finished: without it such a call finishes and answers the earlier operation instead of writing"`
}

// AttachmentInput is an attachment of create_note.
type AttachmentInput struct {
	Filename    string `json:"filename" jsonschema:"the file's name"`
	ContentType string `json:"content_type" jsonschema:"the file's media type, such as text/plain or image/png"`
	Data        string `json:"data" jsonschema:"the file's bytes in standard base64"`
}

// UpdateNoteInput is update_note's arguments. Title and Body are pointers:
// absent (or null) keeps the note's value.
type UpdateNoteInput struct {
	ID              string  `json:"id" jsonschema:"the note's id"`
	ExpectedVersion int     `json:"expected_version" jsonschema:"the note's version as you last read it (get_note's version): the update is refused if the note has changed since"`
	Title           *string `json:"title,omitempty" jsonschema:"the note's new title, 1 to 200 characters, no control characters; omit it (or null) to keep the title"`
	Body            *string `json:"body,omitempty" jsonschema:"the note's new body, up to 65536 characters; omit it (or null) to keep the body, \"\" empties it"`
	OperationKey    string  `json:"operation_key,omitempty" jsonschema:"the operation key of this user request. Omit it on the first call (one is made and returned); pass the returned key again only to retry or finish the SAME request with the SAME arguments"`
}

// DeleteNoteInput is delete_note's arguments.
type DeleteNoteInput struct {
	ID              string `json:"id" jsonschema:"the note's id"`
	ExpectedVersion int    `json:"expected_version,omitempty" jsonschema:"optional: delete only if the note is still at this version (get_note's version); omit it to delete whatever the version"`
	OperationKey    string `json:"operation_key,omitempty" jsonschema:"the operation key of this user request; pass the returned key again only to retry or finish the SAME request"`
}

// GetNoteInput is get_note's arguments.
type GetNoteInput struct {
	ID string `json:"id" jsonschema:"the note's id"`
}

// GetOperationInput is get_operation's arguments.
type GetOperationInput struct {
	OperationKey string `json:"operation_key" jsonschema:"the operation key a write tool returned"`
}

// WriteOutput is the structured content of a write tool.
type WriteOutput struct {
	OperationKey string `json:"operation_key" jsonschema:"the operation key of this request"`
	State        string `json:"state" jsonschema:"completed, refused or unknown"`
	Replayed     bool   `json:"replayed,omitempty" jsonschema:"true when an earlier delivery of this same request had executed it"`
	Resumed      bool   `json:"resumed,omitempty" jsonschema:"true when this call did not write but answered an earlier, unfinished create_note with the same parameters (its operation_key)"`
	Note         any    `json:"note,omitempty" jsonschema:"the note (create_note, update_note) or the deletion (delete_note), when completed"`
	Error        any    `json:"error,omitempty" jsonschema:"the problem, when refused or unknown; for precondition_failed, current_version is the note's version now"`
}

// Config configures a Server.
type Config struct {
	// Version is the implementation version announced to MCP clients.
	// Default "dev".
	Version string
	// Log receives the start-up resume's lines (never stdout, which
	// carries the stdio protocol). Default: no logging.
	Log zerolog.Logger
	// PruneInterval is how often Run prunes the journal by the server's
	// key retention, beginning at start-up (client.Client.PruneJournal).
	// Default DefaultPruneInterval.
	PruneInterval time.Duration
}

// DefaultPruneInterval is how often the journal is pruned: settled records
// are kept for the key retention (720h by default), so an hour late is
// nothing, and a pass reads only the records it removes.
const DefaultPruneInterval = time.Hour

// pruneRetry is the wait before pruning again after the key retention
// could not be read (the API unreachable at start-up), when shorter than
// the interval.
const pruneRetry = time.Minute

// The write tools' names (SPEC §10), which their answers repeat.
const (
	toolCreateNote = "create_note"
	toolUpdateNote = "update_note"
	toolDeleteNote = "delete_note"
)

// Server is the MCP server of one client (one token, one journal).
type Server struct {
	mcp *mcp.Server
	h   *handlers
}

// New returns the MCP server over c. The journal-backed behaviour
// (list_operations, the start-up resume, answering an unsettled operation
// instead of writing it again) needs c to have a Journal; without one
// list_operations answers an error result and every create_note writes.
func New(c *client.Client, cfg Config) *Server {
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "quill", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: "Quill stores notes. Every write (create_note, update_note, delete_note) is one operation with an operation_key. " +
			"If a write's state is \"unknown\", it may have happened: call get_operation with its operation_key instead of writing again. " +
			"update_note takes the expected_version you last read with get_note; if the note has changed since, it is refused (precondition_failed, with current_version): " +
			"call get_note, read the current version and content, and decide — never repeat the update under a new operation_key without reading the note first. " +
			"If a call of yours was cancelled or timed out before you saw its result, call list_operations (or simply call create_note again " +
			"with the same arguments and no operation_key: it answers the unfinished operation instead of creating a second note). " +
			"list_webhooks and get_webhook show the tenant's webhook endpoints and their delivery health; they are read-only: " +
			"endpoints are created, rotated and deleted by a person with the quill command, because those answers carry a signing secret.",
	})
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = DefaultPruneInterval
	}
	h := &handlers{c: c, log: cfg.Log, recovered: map[string]client.JournalEntry{}, pruneEvery: cfg.PruneInterval}
	notDestructive, destructive, idempotent := false, true, true
	mcp.AddTool(s, &mcp.Tool{
		Name: toolCreateNote,
		Description: "Create a note. Returns operation_key and state. state \"completed\": done. \"refused\": the server's answer is final; " +
			"fix the request, or, for idempotency_key_reused, send the original parameters or use a new key for a new request. " +
			"\"unknown\": the note may or may not exist — do not call create_note again for this request; call get_operation with the operation_key. " +
			"An error with error.code \"rate_limited\": the server is overloaded; wait retry_after_seconds, then call create_note again with the SAME operation_key. " +
			"Without operation_key, a call whose title, body and attachment equal those of an unfinished earlier create_note (one whose result was lost) " +
			"does not write: it finishes and answers that earlier operation (resumed: true). Pass new_intent: true only when the user really asks for another, identical note.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &notDestructive, IdempotentHint: true},
	}, h.createNote)
	mcp.AddTool(s, &mcp.Tool{
		Name: toolUpdateNote,
		Description: "Change a note's title and/or body. expected_version is the note's version as you last read it with get_note (required); " +
			"a field you omit is kept. Returns operation_key and state, and the note with its new version when completed (the same version: it already had these values). " +
			"\"refused\" with error.code \"precondition_failed\": the note has changed since you read it (error.current_version is its version now) — " +
			"this update was NOT applied and is final: call get_note, read the current version and content, and decide with the user whether an update is still wanted " +
			"(then a new update_note with the new expected_version). Never retry it unchanged, or under a new operation_key, without reading the note: that would overwrite the other change. " +
			"\"unknown\": call get_operation with the operation_key; on an error with error.code \"rate_limited\", wait retry_after_seconds and call update_note again with the SAME operation_key and arguments.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive, IdempotentHint: idempotent},
	}, h.updateNote)
	mcp.AddTool(s, &mcp.Tool{
		Name: toolDeleteNote,
		Description: "Delete a note by id, or, with expected_version, only if it is still at that version (refused with precondition_failed otherwise: " +
			"call get_note and decide, as for update_note). Returns operation_key and state, as create_note does; on \"unknown\", call get_operation with the operation_key; " +
			"on an error with error.code \"rate_limited\", wait retry_after_seconds and call delete_note again with the SAME operation_key.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive, IdempotentHint: idempotent},
	}, h.deleteNote)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "get_note",
		Description: "Read a note by id: its title, body and version (the expected_version of an update_note or delete_note decided on what you read).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, h.getNote)
	mcp.AddTool(s, &mcp.Tool{
		Name: "get_operation",
		Description: "Look up what became of a write by its operation_key: state \"completed\" with the recorded response, " +
			"\"in_progress\" (ask again shortly), or \"not_found\" (it never executed: retry the write with the SAME operation_key).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, h.getOperation)
	mcp.AddTool(s, &mcp.Tool{
		Name: "list_operations",
		Description: "List the writes begun and not yet finished (their result was lost, or they are still running): operation_key, action " +
			"(create-note, update-note or delete-note), parameters (named as the tool's arguments) and age of each. To finish one, call the same tool again with its operation_key and the same parameters, or get_operation.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, h.listOperations)
	addWebhookTools(s, h)
	return &Server{mcp: s, h: h}
}

// MCP returns the server's protocol side, to connect to a transport.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run resumes the journal's unsettled operations and prunes the journal
// (now and every PruneInterval) in the background — the handshake waits
// for neither — and serves the tools over t until the client disconnects
// or ctx ends; it returns the session's error, after the resume and the
// pruning have stopped.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	ctx, cancel := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { s.Resume(ctx) })
	bg.Go(func() { s.KeepPruned(ctx) })
	err := s.mcp.Run(ctx, t)
	cancel()
	bg.Wait()
	return err
}

type handlers struct {
	c   *client.Client
	log zerolog.Logger
	// mu makes finding an unsettled create_note with equal parameters and
	// journalling a new one a single step, so that two identical calls at
	// once do not both miss each other and write twice.
	mu sync.Mutex
	// recovered are the create_note operations the start-up resume
	// settled: no model has seen their outcome, so an identical call
	// without a key is answered with them (once) instead of writing again.
	recovered map[string]client.JournalEntry
	// pruneEvery is Config.PruneInterval.
	pruneEvery time.Duration
}

func text(s string, isError bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}, IsError: isError}
}

// writeOutcome turns a write's answer into the tool's result.
func writeOutcome(tool, key string, w *client.Write, resource any, err error) (*mcp.CallToolResult, WriteOutput, error) {
	out := WriteOutput{OperationKey: key}
	var (
		refused *client.RefusedError
		unknown *client.UnknownOutcomeError
	)
	switch {
	case err == nil:
		out.State, out.Replayed, out.Note = StateCompleted, w.Replayed, resource
		b, _ := json.Marshal(resource)
		msg := fmt.Sprintf("%s completed (operation_key %q).", tool, key)
		if w.Replayed {
			msg = fmt.Sprintf("%s completed (operation_key %q); an earlier delivery of this same request had executed it, nothing was done twice.", tool, key)
		}
		return text(msg+" Result: "+string(b), false), out, nil
	case errors.As(err, &refused):
		out.State, out.Error = StateRefused, refused.Problem
		advice := "Fix the request before trying again."
		switch {
		case refused.Problem.Code == contract.CodeKeyReused:
			advice = "This operation_key belongs to a different request: a new request needs a new key (omit operation_key); the same request must send its original parameters."
		case refused.Problem.Retry == contract.RetryNo:
			advice = "This answer is final; do not retry."
		}
		return text(fmt.Sprintf("%s refused (operation_key %q): %v. %s", tool, key, refused.Problem, advice), true), out, nil
	case errors.As(err, &unknown) && rateLimited(unknown) != nil && unknown.Lookup != contract.OperationInProgress:
		// The server declined the attempts for now (429 rate_limited)
		// until the client's attempts ran out, and the lookup found
		// nothing executing. The operation's state stays unknown (an
		// earlier attempt or call with this key may have executed it), but
		// this call did not do its work: a retryable error result
		// (decision 0043) that tells the model to call again with the
		// same key, which is safe either way.
		p := rateLimited(unknown)
		out.State = StateUnknown
		out.Error = map[string]any{"code": contract.CodeRateLimited, "detail": err.Error(), "retry": contract.RetrySameKey,
			"retry_after_seconds": int(p.RetryAfter.Round(time.Second) / time.Second)}
		wait := "a few seconds"
		if p.RetryAfter > 0 {
			wait = p.RetryAfter.Round(time.Second).String()
		}
		return text(fmt.Sprintf("%s did not complete: the server is overloaded (429 rate_limited) and declined the attempts until they ran out (operation_key %q). "+
			"Wait %s, then call %s again with the SAME operation_key %q and the same arguments; that is safe even if an earlier attempt executed. "+
			"Do not use a new key for this request.", tool, key, wait, tool, key), true), out, nil
	case errors.As(err, &unknown):
		out.State = StateUnknown
		out.Error = map[string]string{"code": "outcome_unknown", "detail": err.Error(), "retry": contract.RetrySameKey}
		// Not an error result: the operation may well have happened.
		return text(fmt.Sprintf("The outcome of %s is UNKNOWN: it may or may not have happened (operation_key %q). "+
			"Do NOT call %s again as a new request. Call get_operation with operation_key %q to learn the outcome; "+
			"if it answers not_found, call %s again with the SAME operation_key %q.", tool, key, tool, key, tool, key), false), out, nil
	case errors.Is(err, client.ErrKeyTooOld):
		out.State = StateUnknown
		out.Error = map[string]string{"code": "key_too_old", "detail": err.Error(), "retry": contract.RetryNo}
		return text(fmt.Sprintf("%s was not sent: operation_key %q is older than the server's key retention, which may have forgotten it, "+
			"so sending it again could execute it twice. Call get_operation with operation_key %q to learn its outcome.", tool, key, key), true), out, nil
	default:
		out.State = StateUnknown
		out.Error = map[string]string{"code": "failure", "detail": err.Error()}
		return text(fmt.Sprintf("%s failed before its outcome was known (operation_key %q): %v. "+
			"Call get_operation with this operation_key before anything else.", tool, key, err), true), out, nil
	}
}

// rateLimited returns the last answer's problem when it was 429
// rate_limited, or nil.
func rateLimited(u *client.UnknownOutcomeError) *client.Problem {
	var p *client.Problem
	if errors.As(u.Cause, &p) && p.Code == contract.CodeRateLimited {
		return p
	}
	return nil
}

// badKey is the result of a write whose operation_key is not a key:
// refused before anything was journalled or sent.
func badKey(tool, key string, err error) (*mcp.CallToolResult, WriteOutput, error) {
	out := WriteOutput{OperationKey: key, State: StateRefused,
		Error: map[string]string{"code": contract.CodeValidation, "detail": "operation_key: " + err.Error(), "retry": contract.RetryAfterFixing}}
	return text(fmt.Sprintf("%s refused: operation_key %q is not a valid key (%v); nothing was sent. "+
		"Omit operation_key for a new request.", tool, key, err), true), out, nil
}

func (h *handlers) createNote(ctx context.Context, _ *mcp.CallToolRequest, in CreateNoteInput) (*mcp.CallToolResult, WriteOutput, error) {
	key := in.OperationKey
	if key != "" {
		k, err := opkey.Parse(key)
		if err != nil {
			return badKey(toolCreateNote, key, err)
		}
		key = k
	}
	n := client.NewNote{Title: in.Title, Body: in.Body}
	if a := in.Attachment; a != nil {
		data, err := base64.StdEncoding.DecodeString(a.Data)
		if err != nil {
			if key == "" {
				key = h.c.NewKey() // never sent: the model may keep it or not
			}
			out := WriteOutput{OperationKey: key, State: StateRefused,
				Error: map[string]string{"code": contract.CodeValidation, "detail": "attachment.data is not standard base64", "retry": contract.RetryAfterFixing}}
			return text(fmt.Sprintf("create_note refused (operation_key %q): attachment.data is not standard base64; nothing was sent.", key), true), out, nil
		}
		n.Attachment = &client.NewAttachment{Filename: a.Filename, ContentType: a.ContentType, Data: data}
	}
	if key == "" {
		e, earlier, err := h.claim(ctx, n, in.NewIntent)
		if err != nil {
			out := WriteOutput{OperationKey: e.Key, State: StateUnknown, Error: map[string]string{"code": "failure", "detail": err.Error()}}
			return text(fmt.Sprintf("create_note was not sent (operation_key %q): %v. Nothing was written; call create_note again.", e.Key, err), true), out, nil
		}
		if earlier {
			return h.finishEarlier(ctx, e)
		}
		key = e.Key
	}
	res, err := h.c.CreateNote(ctx, n, client.WithKey(key))
	h.unseen(ctx, key)
	if err != nil {
		return writeOutcome(toolCreateNote, key, nil, nil, err)
	}
	return writeOutcome(toolCreateNote, key, &res.Write, res.Note, nil)
}

// unseen remembers key's settled create_note when its call was cancelled:
// the write may have finished as the host gave up, and then no model saw
// its result, so an identical call without a key answers it rather than
// writing again. (Unsettled, claim finds it in the journal anyway.)
func (h *handlers) unseen(ctx context.Context, key string) {
	j := h.c.Config().Journal
	if ctx.Err() == nil || j == nil {
		return
	}
	e, err := j.Get(context.WithoutCancel(ctx), key)
	if err != nil || e.Settled == nil {
		return
	}
	h.mu.Lock()
	h.recovered[key] = e
	h.mu.Unlock()
}

// claim picks the operation of a create_note without a key: an earlier
// one with equal parameters that no model has seen finish — unsettled in
// the journal, or settled by the start-up resume — (earlier is true), or
// else a new key, journalled here so that an identical call arriving
// meanwhile finds it. With newIntent, or without a journal, it is always a
// new key. The returned entry's Key is set even with an error.
func (h *handlers) claim(ctx context.Context, n client.NewNote, newIntent bool) (e client.JournalEntry, earlier bool, err error) {
	e = client.JournalEntry{Key: h.c.NewKey(), Action: contract.ActionCreateNote}
	j := h.c.Config().Journal
	if j == nil {
		return e, false, nil
	}
	params, err := json.Marshal(n)
	if err != nil {
		return e, false, fmt.Errorf("encode note: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !newIntent {
		for k, r := range h.recovered {
			if sameParams(r.Params, params) {
				delete(h.recovered, k)
				return r, true, nil
			}
		}
		// Records that cannot be read are skipped: they cannot be matched
		// (and Resume reports them).
		unsettled, _ := j.Unsettled(ctx)
		for _, u := range unsettled {
			if u.Action == contract.ActionCreateNote && sameParams(u.Params, params) {
				return u, true, nil
			}
		}
	}
	e.Params, e.CreatedAt = params, h.c.Config().Now().UTC()
	if _, err := j.Begin(ctx, e); err != nil {
		return e, false, fmt.Errorf("journal operation %q before sending: %w", e.Key, err)
	}
	return e, false, nil
}

// sameParams tells whether two create-note parameter documents are equal.
// Both are the client's encoding of a NewNote, so equal notes are equal
// bytes; compacting only guards against a record written with other
// spacing.
func sameParams(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

// finishEarlier answers a create_note with the earlier operation e: its
// recorded outcome when settled, else the outcome of sending it again
// under its own key and first-sent time (a resume of that one entry).
func (h *handlers) finishEarlier(ctx context.Context, e client.JournalEntry) (*mcp.CallToolResult, WriteOutput, error) {
	if cur, err := h.c.Config().Journal.Get(ctx, e.Key); err == nil {
		e = cur
	}
	var (
		res *mcp.CallToolResult
		out WriteOutput
	)
	switch s := e.Settled; {
	case s != nil && s.State == client.StateCompleted:
		res, out, _ = writeOutcome(toolCreateNote, e.Key, &client.Write{Key: e.Key, Replayed: true}, json.RawMessage(s.Body), nil)
	case s != nil:
		p := &client.Problem{Status: s.Status, Retry: contract.RetryNo}
		_ = json.Unmarshal(s.Body, p)
		res, out, _ = writeOutcome(toolCreateNote, e.Key, nil, nil, &client.RefusedError{Key: e.Key, Replayed: true, Problem: p})
	default:
		var n client.NewNote
		if err := json.Unmarshal(e.Params, &n); err != nil {
			res, out, _ = writeOutcome(toolCreateNote, e.Key, nil, nil, fmt.Errorf("journalled parameters of %q: %w", e.Key, err))
			break
		}
		created, err := h.c.CreateNote(ctx, n, client.WithKey(e.Key), client.WithFirstSent(e.CreatedAt))
		h.unseen(ctx, e.Key)
		if err != nil {
			res, out, _ = writeOutcome(toolCreateNote, e.Key, nil, nil, err)
			break
		}
		res, out, _ = writeOutcome(toolCreateNote, e.Key, &created.Write, created.Note, nil)
	}
	out.Resumed = true
	prefix := fmt.Sprintf("This call did not create a note: an earlier create_note with the same parameters, begun at %s, had not reported its result "+
		"(operation_key %q); this is that operation's outcome. If the user really asked for another, identical note, call create_note again with new_intent: true. ",
		e.CreatedAt.UTC().Format(time.RFC3339), e.Key)
	if t, ok := res.Content[0].(*mcp.TextContent); ok {
		t.Text = prefix + t.Text
	}
	return res, out, nil
}

// writeKey returns the key of a write tool's call: the model's, checked
// (an error when it is not a key), or a new one.
func (h *handlers) writeKey(key string) (string, error) {
	if key == "" {
		return h.c.NewKey(), nil
	}
	return opkey.Parse(key)
}

// invalid is the result of a write whose arguments cannot be sent:
// refused before anything was journalled or sent.
func invalid(tool, key, detail string) (*mcp.CallToolResult, WriteOutput, error) {
	out := WriteOutput{OperationKey: key, State: StateRefused,
		Error: map[string]string{"code": contract.CodeValidation, "detail": detail, "retry": contract.RetryAfterFixing}}
	return text(fmt.Sprintf("%s refused (operation_key %q): %s; nothing was sent. Fix the arguments.", tool, key, detail), true), out, nil
}

func (h *handlers) updateNote(ctx context.Context, _ *mcp.CallToolRequest, in UpdateNoteInput) (*mcp.CallToolResult, WriteOutput, error) {
	key, err := h.writeKey(in.OperationKey)
	if err != nil {
		return badKey(toolUpdateNote, in.OperationKey, err)
	}
	switch {
	case in.ExpectedVersion < 1 || in.ExpectedVersion > client.MaxVersion:
		return invalid(toolUpdateNote, key, fmt.Sprintf("expected_version %d is not a version: pass the note's version as get_note shows it", in.ExpectedVersion))
	case in.Title == nil && in.Body == nil:
		return invalid(toolUpdateNote, key, "nothing to update: pass title, body or both")
	}
	res, err := h.c.UpdateNote(ctx, in.ID, in.ExpectedVersion, client.NoteUpdate{Title: in.Title, Body: in.Body}, key)
	if err != nil {
		return editOutcome(toolUpdateNote, key, in.ID, in.ExpectedVersion, nil, nil, err)
	}
	return writeOutcome(toolUpdateNote, key, &res.Write, res.Note, nil)
}

func (h *handlers) deleteNote(ctx context.Context, _ *mcp.CallToolRequest, in DeleteNoteInput) (*mcp.CallToolResult, WriteOutput, error) {
	key, err := h.writeKey(in.OperationKey)
	if err != nil {
		return badKey(toolDeleteNote, in.OperationKey, err)
	}
	var res *client.Deleted
	switch v := in.ExpectedVersion; {
	case v == 0:
		res, err = h.c.DeleteNote(ctx, in.ID, client.WithKey(key))
	case v < 1 || v > client.MaxVersion:
		return invalid(toolDeleteNote, key, fmt.Sprintf("expected_version %d is not a version: pass the note's version as get_note shows it, or omit it", v))
	default:
		res, err = h.c.DeleteNoteIfVersion(ctx, in.ID, v, client.WithKey(key))
	}
	if err != nil {
		return editOutcome(toolDeleteNote, key, in.ID, in.ExpectedVersion, nil, nil, err)
	}
	return writeOutcome(toolDeleteNote, key, &res.Write, res.Deletion, nil)
}

// editOutcome is writeOutcome for a write under an expected version: a
// 412 precondition_failed gets the text that sends the model to read the
// note and decide — the one answer where a retry under a new key is the
// harm (it would overwrite the change this write missed).
func editOutcome(tool, key, id string, expected int, w *client.Write, resource any, err error) (*mcp.CallToolResult, WriteOutput, error) {
	var refused *client.RefusedError
	if !errors.As(err, &refused) || refused.Problem.Code != contract.CodePreconditionFailed {
		return writeOutcome(tool, key, w, resource, err)
	}
	out := WriteOutput{OperationKey: key, State: StateRefused, Error: refused.Problem}
	current := "another version"
	if v := refused.Problem.CurrentVersion; v > 0 {
		current = fmt.Sprintf("version %d", v)
	}
	return text(fmt.Sprintf("%s refused (operation_key %q): precondition_failed — note %s is now at %s, not the expected_version %d: "+
		"it was changed after you read it, and this %s was NOT applied. This answer is final: do not call %s again with this operation_key, "+
		"and do not repeat it under a new operation_key without reading the note first (that would overwrite the other change). "+
		"Call get_note with id %q, read its current version and content, and decide whether the user's intent still calls for a change; "+
		"if so, call %s with expected_version set to the version you read (a new request: omit operation_key).",
		tool, key, id, current, expected, tool, tool, id, tool), true), out, nil
}

func toMap(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func (h *handlers) getNote(ctx context.Context, _ *mcp.CallToolRequest, in GetNoteInput) (*mcp.CallToolResult, map[string]any, error) {
	n, err := h.c.GetNote(ctx, in.ID)
	if err != nil {
		var p *client.Problem
		if errors.As(err, &p) {
			return text("get_note: "+p.Error(), true), map[string]any{"error": toMap(p)}, nil
		}
		return nil, nil, err
	}
	return nil, toMap(n), nil
}

func (h *handlers) getOperation(ctx context.Context, _ *mcp.CallToolRequest, in GetOperationInput) (*mcp.CallToolResult, map[string]any, error) {
	op, err := h.c.GetOperation(ctx, in.OperationKey)
	var p *client.Problem
	switch {
	case errors.As(err, &p) && p.Code == contract.CodeOpNotFound:
		return text(fmt.Sprintf("Nothing with operation_key %q is recorded or executing: the write never executed. "+
				"Send the same request again with the SAME operation_key.", in.OperationKey), false),
			map[string]any{"operation_key": in.OperationKey, "state": "not_found"}, nil
	case errors.As(err, &p):
		return text(fmt.Sprintf("get_operation (operation_key %q): %s", in.OperationKey, p.Error()), true),
			map[string]any{"operation_key": in.OperationKey, "error": toMap(p)}, nil
	case err != nil:
		return text(fmt.Sprintf("get_operation (operation_key %q) got no answer: %v. Call get_operation again shortly.", in.OperationKey, err), true),
			map[string]any{"operation_key": in.OperationKey, "error": map[string]string{"code": "failure", "detail": err.Error()}}, nil
	}
	var m map[string]any
	if err := json.Unmarshal(op.Raw, &m); err != nil {
		return nil, nil, fmt.Errorf("decode lookup: %w", err)
	}
	return nil, m, nil
}
