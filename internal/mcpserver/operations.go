package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/wait"
)

// ListOperationsInput is list_operations' arguments (none).
type ListOperationsInput struct{}

// ListOperationsOutput is list_operations' structured content.
type ListOperationsOutput struct {
	Operations []Operation `json:"operations" jsonschema:"the unfinished writes, oldest first"`
	// Warning names journal records that could not be read.
	Warning string `json:"warning,omitempty" jsonschema:"journal records that could not be read, if any"`
}

// Operation is one unsettled journalled write.
type Operation struct {
	OperationKey string         `json:"operation_key" jsonschema:"the operation's key"`
	Action       string         `json:"action" jsonschema:"create-note, update-note or delete-note"`
	Params       map[string]any `json:"params" jsonschema:"the write's parameters, named as the tool's arguments: title, body and attachment (its filename, content_type and size_bytes; not its data) for create-note; id, expected_version and the title and/or body given for update-note; id (and expected_version when given) for delete-note"`
	FirstSentAt  time.Time      `json:"first_sent_at" jsonschema:"when it was first journalled, just before its first send"`
	AgeSeconds   int64          `json:"age_seconds" jsonschema:"seconds since first_sent_at"`
}

// summary is the parameters of e as list_operations shows them, named as
// the tool's arguments (the journal's if_version is expected_version), so
// that the model can call the same tool with them: an attachment's bytes
// are left out (up to 1 MiB of base64 has no place in a model's context;
// the journal keeps them for the resume).
func summary(e client.JournalEntry) map[string]any {
	m := map[string]any{}
	switch e.Action {
	case contract.ActionCreateNote:
		var n client.NewNote
		if json.Unmarshal(e.Params, &n) == nil {
			m["title"] = n.Title
			if n.Body != "" {
				m["body"] = n.Body
			}
			if a := n.Attachment; a != nil {
				m["attachment"] = map[string]any{"filename": a.Filename, "content_type": a.ContentType, "size_bytes": len(a.Data)}
			}
			return m
		}
	case contract.ActionUpdateNote, contract.ActionDeleteNote:
		// The journal's format (client.JournalEntry.Params): {"id",
		// "if_version", "title"?, "body"?}.
		var p struct {
			ID        string  `json:"id"`
			IfVersion int     `json:"if_version"`
			Title     *string `json:"title"`
			Body      *string `json:"body"`
		}
		if json.Unmarshal(e.Params, &p) == nil {
			m["id"] = p.ID
			if p.IfVersion != 0 {
				m["expected_version"] = p.IfVersion
			}
			if p.Title != nil {
				m["title"] = *p.Title
			}
			if p.Body != nil {
				m["body"] = *p.Body
			}
			return m
		}
	}
	_ = json.Unmarshal(e.Params, &m)
	return m
}

func (h *handlers) listOperations(ctx context.Context, _ *mcp.CallToolRequest, _ ListOperationsInput) (*mcp.CallToolResult, ListOperationsOutput, error) {
	out := ListOperationsOutput{Operations: []Operation{}}
	j := h.c.Config().Journal
	if j == nil {
		return text("list_operations: this server has no journal, so it keeps no record of unfinished writes.", true), out, nil
	}
	entries, err := j.Unsettled(ctx)
	if err != nil && !errors.Is(err, client.ErrCorruptRecord) {
		return text("list_operations: the journal cannot be read: "+err.Error(), true), out, nil
	}
	if err != nil {
		out.Warning = err.Error()
	}
	now := h.c.Config().Now()
	var sb strings.Builder
	for _, e := range entries {
		if webhookAction(e.Action) {
			continue // a person's, finished with quill ops resume
		}
		out.Operations = append(out.Operations, Operation{OperationKey: e.Key, Action: e.Action, Params: summary(e),
			FirstSentAt: e.CreatedAt.UTC(), AgeSeconds: int64(now.Sub(e.CreatedAt) / time.Second)})
		fmt.Fprintf(&sb, "\n- operation_key %q: %s, first sent %s ago", e.Key, e.Action, now.Sub(e.CreatedAt).Round(time.Second))
	}
	msg := "No unfinished writes: every journalled operation has a known outcome."
	if n := len(out.Operations); n > 0 {
		msg = fmt.Sprintf("%d unfinished write(s); each may or may not have happened. Finish one by calling the same tool with its operation_key "+
			"and the same parameters (or learn its outcome with get_operation); never by a new write without the key:%s", n, sb.String())
	}
	if out.Warning != "" {
		msg += "\nSome journal records could not be read: " + out.Warning
	}
	return text(msg, false), out, nil
}

// Resume sends again every operation unsettled in the journal when it is
// called, one at a time, oldest first, under its original key and
// parameters (as client.Resume does), and logs each outcome. The
// create_note operations among them are remembered as unseen by any model:
// a later create_note without a key and with equal parameters is answered
// with that operation instead of writing a second note. Webhook endpoint
// writes (journalled by quill webhooks) are left unsettled for quill ops
// resume: their answers may carry a secret, for the person who asked. It
// returns when all are done or ctx ends; a client without a journal has
// nothing to resume.
func (s *Server) Resume(ctx context.Context) {
	h := s.h
	j := h.c.Config().Journal
	if j == nil {
		return
	}
	h.mu.Lock()
	all, err := j.Unsettled(ctx)
	var entries []client.JournalEntry
	skipped := 0
	for _, e := range all {
		if webhookAction(e.Action) {
			// A webhook write journalled by quill webhooks: its answer
			// may carry a secret, which only the person's quill ops
			// resume should receive and show.
			skipped++
			continue
		}
		entries = append(entries, e)
		if e.Action == contract.ActionCreateNote {
			h.recovered[e.Key] = e
		}
	}
	h.mu.Unlock()
	if skipped > 0 {
		h.log.Info().Int("operations", skipped).Msg("unsettled webhook endpoint writes are left for quill ops resume")
	}
	if err != nil {
		h.log.Warn().Err(err).Msg("journal: some records cannot be read")
		if !errors.Is(err, client.ErrCorruptRecord) {
			return
		}
	}
	if len(entries) > 0 {
		h.log.Info().Int("operations", len(entries)).Msg("resuming unsettled journalled operations")
	}
	for _, e := range entries {
		if ctx.Err() != nil {
			return
		}
		state, detail := h.resumeOne(ctx, e)
		ev := h.log.Info()
		if state != StateCompleted {
			ev = h.log.Warn()
		}
		ev.Str("operation_key", e.Key).Str("action", e.Action).Str("state", state).Str("detail", detail).Msg("resumed journalled operation")
	}
}

// resumeOne sends e again (client.Client.ResumeEntry) and says how it
// ended.
func (h *handlers) resumeOne(ctx context.Context, e client.JournalEntry) (state, detail string) {
	r := h.c.ResumeEntry(ctx, e)
	switch {
	case r.Err == nil && r.Created != nil:
		return StateCompleted, "note " + r.Created.Note.ID
	case r.Err == nil && r.Updated != nil:
		return StateCompleted, fmt.Sprintf("note %s at version %d", r.Updated.Note.ID, r.Updated.Note.Version)
	case r.Err == nil && r.Deleted != nil:
		return StateCompleted, "deleted note " + r.Deleted.Deletion.ID
	case r.Err == nil:
		// A webhook write (Resume skips them): its secret is never
		// logged.
		return StateCompleted, e.Action
	}
	var refused *client.RefusedError
	if errors.As(r.Err, &refused) {
		return StateRefused, r.Err.Error()
	}
	return StateUnknown, r.Err.Error()
}

// KeepPruned prunes the journal by the server's key retention now and then
// every PruneInterval until ctx ends (after a pass that could not read the
// retention, again within a minute), logging what each pass removed and
// the unsettled operations past the retention, which it keeps. A client
// without a journal has nothing to prune. The per-call path never prunes:
// a create_note reads only the unsettled records however many are settled,
// and the pruning keeps the settled ones from filling the disk.
func (s *Server) KeepPruned(ctx context.Context) {
	if s.h.c.Config().Journal == nil {
		return
	}
	for {
		next := s.h.pruneEvery
		if !s.Prune(ctx) {
			next = min(next, pruneRetry)
		}
		if !wait.For(ctx, next) {
			return
		}
	}
}

// Prune prunes the journal once by the server's key retention
// (client.Client.PruneJournal) and logs the outcome; it reports whether
// the retention could be read.
func (s *Server) Prune(ctx context.Context) bool {
	h := s.h
	res, err := h.c.PruneJournal(ctx)
	switch {
	case errors.Is(err, client.ErrLimitsUnavailable):
		if ctx.Err() == nil {
			h.log.Warn().Err(err).Msg("journal not pruned: the server's key retention could not be read")
		}
		return false
	case errors.Is(err, client.ErrNoJournal), errors.Is(err, client.ErrJournalNotPrunable):
		return true
	case err != nil && ctx.Err() == nil:
		h.log.Warn().Err(err).Msg("journal: pruning met records it cannot read (they are kept)")
	}
	if len(res.Removed) > 0 {
		h.log.Info().Int("removed", len(res.Removed)).Msg("pruned settled operations past the key retention from the journal")
	}
	if n := len(res.Expired); n > 0 {
		h.log.Warn().Int("operations", n).Str("oldest_operation_key", res.Expired[0].Key).
			Msg("unsettled operations past the key retention are kept in the journal: their outcome may stay unknown (quill ops get KEY; quill ops prune --abandon removes them)")
	}
	return true
}
