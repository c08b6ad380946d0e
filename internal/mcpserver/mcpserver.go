// Package mcpserver exposes Quill to AI agents as an MCP server: the tools
// create_note, delete_note, get_note and get_operation (SPEC §10), each
// backed by the Go client, so that every write keeps one operation key
// across retries, is journalled when the client has a journal, and reports
// an unknown outcome as a state to look up rather than a failure to retry.
package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quillhq/quill/client"
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
}

// AttachmentInput is an attachment of create_note.
type AttachmentInput struct {
	Filename    string `json:"filename" jsonschema:"the file's name"`
	ContentType string `json:"content_type" jsonschema:"the file's media type, such as text/plain or image/png"`
	Data        string `json:"data" jsonschema:"the file's bytes in standard base64"`
}

// DeleteNoteInput is delete_note's arguments.
type DeleteNoteInput struct {
	ID           string `json:"id" jsonschema:"the note's id"`
	OperationKey string `json:"operation_key,omitempty" jsonschema:"the operation key of this user request; pass the returned key again only to retry or finish the SAME request"`
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
	Note         any    `json:"note,omitempty" jsonschema:"the note (create_note) or the deletion (delete_note), when completed"`
	Error        any    `json:"error,omitempty" jsonschema:"the problem, when refused or unknown"`
}

// New returns the MCP server over c.
func New(c *client.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "quill", Version: version}, &mcp.ServerOptions{
		Instructions: "Quill stores notes. Every write (create_note, delete_note) is one operation with an operation_key. " +
			"If a write's state is \"unknown\", it may have happened: call get_operation with its operation_key instead of writing again.",
	})
	h := &handlers{c: c}
	notDestructive, destructive, idempotent := false, true, true
	mcp.AddTool(s, &mcp.Tool{
		Name: "create_note",
		Description: "Create a note. Returns operation_key and state. state \"completed\": done. \"refused\": the server's answer is final; " +
			"fix the request, or, for idempotency_key_reused, send the original parameters or use a new key for a new request. " +
			"\"unknown\": the note may or may not exist — do not call create_note again for this request; call get_operation with the operation_key. " +
			"An error with error.code \"rate_limited\": the server is overloaded; wait retry_after_seconds, then call create_note again with the SAME operation_key.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &notDestructive, IdempotentHint: true},
	}, h.createNote)
	mcp.AddTool(s, &mcp.Tool{
		Name: "delete_note",
		Description: "Delete a note by id. Returns operation_key and state, as create_note does; on \"unknown\", call get_operation with the operation_key; " +
			"on an error with error.code \"rate_limited\", wait retry_after_seconds and call delete_note again with the SAME operation_key.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive, IdempotentHint: idempotent},
	}, h.deleteNote)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "get_note",
		Description: "Read a note by id.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, h.getNote)
	mcp.AddTool(s, &mcp.Tool{
		Name: "get_operation",
		Description: "Look up what became of a write by its operation_key: state \"completed\" with the recorded response, " +
			"\"in_progress\" (ask again shortly), or \"not_found\" (it never executed: retry the write with the SAME operation_key).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, h.getOperation)
	return s
}

type handlers struct{ c *client.Client }

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
		case refused.Problem.Code == "idempotency_key_reused":
			advice = "This operation_key belongs to a different request: a new request needs a new key (omit operation_key); the same request must send its original parameters."
		case refused.Problem.Retry == client.RetryNo:
			advice = "This answer is final; do not retry."
		}
		return text(fmt.Sprintf("%s refused (operation_key %q): %v. %s", tool, key, refused.Problem, advice), true), out, nil
	case errors.As(err, &unknown) && rateLimited(unknown) != nil && unknown.Lookup != "in_progress":
		// The server declined the attempts for now (429 rate_limited)
		// until the client's attempts ran out, and the lookup found
		// nothing executing. The operation's state stays unknown (an
		// earlier attempt or call with this key may have executed it), but
		// this call did not do its work: a retryable error result
		// (decision 0043) that tells the model to call again with the
		// same key, which is safe either way.
		p := rateLimited(unknown)
		out.State = StateUnknown
		out.Error = map[string]any{"code": "rate_limited", "detail": err.Error(), "retry": client.RetrySameKey,
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
		out.Error = map[string]string{"code": "outcome_unknown", "detail": err.Error(), "retry": client.RetrySameKey}
		// Not an error result: the operation may well have happened.
		return text(fmt.Sprintf("The outcome of %s is UNKNOWN: it may or may not have happened (operation_key %q). "+
			"Do NOT call %s again as a new request. Call get_operation with operation_key %q to learn the outcome; "+
			"if it answers not_found, call %s again with the SAME operation_key %q.", tool, key, tool, key, tool, key), false), out, nil
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
	if errors.As(u.Cause, &p) && p.Code == "rate_limited" {
		return p
	}
	return nil
}

func (h *handlers) key(k string) (string, error) {
	if k == "" {
		return h.c.NewKey(), nil
	}
	return k, nil
}

func (h *handlers) createNote(ctx context.Context, _ *mcp.CallToolRequest, in CreateNoteInput) (*mcp.CallToolResult, WriteOutput, error) {
	key, _ := h.key(in.OperationKey)
	n := client.NewNote{Title: in.Title, Body: in.Body}
	if a := in.Attachment; a != nil {
		data, err := base64.StdEncoding.DecodeString(a.Data)
		if err != nil {
			out := WriteOutput{OperationKey: key, State: StateRefused,
				Error: map[string]string{"code": "validation_failed", "detail": "attachment.data is not standard base64"}}
			return text("create_note refused: attachment.data is not standard base64; nothing was sent.", true), out, nil
		}
		n.Attachment = &client.NewAttachment{Filename: a.Filename, ContentType: a.ContentType, Data: data}
	}
	res, err := h.c.CreateNote(ctx, n, client.WithKey(key))
	if err != nil {
		return writeOutcome("create_note", key, nil, nil, err)
	}
	return writeOutcome("create_note", key, &res.Write, res.Note, nil)
}

func (h *handlers) deleteNote(ctx context.Context, _ *mcp.CallToolRequest, in DeleteNoteInput) (*mcp.CallToolResult, WriteOutput, error) {
	key, _ := h.key(in.OperationKey)
	res, err := h.c.DeleteNote(ctx, in.ID, client.WithKey(key))
	if err != nil {
		return writeOutcome("delete_note", key, nil, nil, err)
	}
	return writeOutcome("delete_note", key, &res.Write, res.Deletion, nil)
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
	case errors.As(err, &p) && p.Code == "operation_not_found":
		return text(fmt.Sprintf("Nothing with operation_key %q is recorded or executing: the write never executed. "+
				"Send the same request again with the SAME operation_key.", in.OperationKey), false),
			map[string]any{"state": "not_found"}, nil
	case errors.As(err, &p):
		return text("get_operation: "+p.Error(), true), map[string]any{"error": toMap(p)}, nil
	case err != nil:
		return nil, nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(op.Raw, &m); err != nil {
		return nil, nil, fmt.Errorf("decode lookup: %w", err)
	}
	return nil, m, nil
}
