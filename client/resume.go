package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/quillhq/quill/contract"
)

// Resumed is the result of resuming one journalled operation.
type Resumed struct {
	// Entry is the journalled operation.
	Entry JournalEntry
	// Created, Updated or Deleted is the answer when the operation
	// completed.
	Created *Created
	Updated *Updated
	Deleted *Deleted
	// WebhookCreated, WebhookDeleted or WebhookSecretRotated is the
	// answer of a webhook endpoint's write that completed; a create's or
	// rotation's carries the secret, which nothing else shows again.
	WebhookCreated       *WebhookCreated
	WebhookDeleted       *WebhookDeleted
	WebhookSecretRotated *WebhookSecretRotated
	// Err is why it did not complete: a *RefusedError (settled, final),
	// an *UnknownOutcomeError (still unsettled), ErrKeyTooOld, or another
	// error.
	Err error
}

// ErrNoJournal is returned by Resume for a client without a Journal.
var ErrNoJournal = errors.New("the client has no journal")

// Resume sends every unsettled journalled operation again, under its
// original key and with its original parameters, and settles it in the
// journal when its outcome is known. A key first sent longer ago than the
// key retention (Config.KeyRetention, else the server's, read once before
// the first entry) is not sent: its Resumed.Err is ErrKeyTooOld, naming the
// key, and it stays unsettled. Operations are resumed one at a time,
// oldest first. The error reports a journal that cannot be read (records
// that cannot be parsed are reported too, while the others are resumed).
func (c *Client) Resume(ctx context.Context) ([]Resumed, error) {
	if c.cfg.Journal == nil {
		return nil, ErrNoJournal
	}
	entries, jerr := c.cfg.Journal.Unsettled(ctx)
	if jerr != nil && !errors.Is(jerr, ErrCorruptRecord) {
		return nil, jerr
	}
	if len(entries) > 0 && c.cfg.KeyRetention == 0 {
		// Every entry's key was sent before: its age is checked against
		// the server's key retention, read here once for all of them. A
		// failure is not the resume's: each entry then meets the
		// fallback (see Config.KeyRetention).
		_, _ = c.keyRetention(ctx)
	}
	out := make([]Resumed, 0, len(entries))
	for _, e := range entries {
		if ctx.Err() != nil {
			break
		}
		out = append(out, c.ResumeEntry(ctx, e))
	}
	return out, jerr
}

// ResumeEntry sends the journalled operation e again, under its key and
// first-sent time and with its parameters, as Resume does for each
// unsettled operation; Resumed.Err says why it did not complete. It is for
// a caller that picks the operations itself (the MCP server's start-up).
func (c *Client) ResumeEntry(ctx context.Context, e JournalEntry) Resumed {
	r := Resumed{Entry: e}
	opts := []WriteOption{WithKey(e.Key), WithFirstSent(e.CreatedAt)}
	bad := func(err error) Resumed {
		r.Err = fmt.Errorf("journalled parameters of %q: %w", e.Key, err)
		return r
	}
	switch e.Action {
	case contract.ActionCreateNote:
		var n NewNote
		if err := json.Unmarshal(e.Params, &n); err != nil {
			return bad(err)
		}
		r.Created, r.Err = c.CreateNote(ctx, n, opts...)
	case contract.ActionUpdateNote:
		var p updateParams
		if err := json.Unmarshal(e.Params, &p); err != nil {
			return bad(err)
		}
		r.Updated, r.Err = c.UpdateNote(ctx, p.ID, p.IfVersion, NoteUpdate{Title: p.Title, Body: p.Body}, e.Key, opts...)
	case contract.ActionDeleteNote:
		var p deleteParams
		if err := json.Unmarshal(e.Params, &p); err != nil {
			return bad(err)
		}
		if p.IfVersion != 0 {
			r.Deleted, r.Err = c.DeleteNoteIfVersion(ctx, p.ID, p.IfVersion, opts...)
		} else {
			r.Deleted, r.Err = c.DeleteNote(ctx, p.ID, opts...)
		}
	case contract.ActionCreateWebhook:
		var w NewWebhook
		if err := json.Unmarshal(e.Params, &w); err != nil {
			return bad(err)
		}
		r.WebhookCreated, r.Err = c.CreateWebhook(ctx, w, opts...)
	case contract.ActionDeleteWebhook, contract.ActionRotateWebhookSecret:
		var p webhookParams
		if err := json.Unmarshal(e.Params, &p); err != nil {
			return bad(err)
		}
		if e.Action == contract.ActionDeleteWebhook {
			r.WebhookDeleted, r.Err = c.DeleteWebhook(ctx, p.ID, opts...)
		} else {
			r.WebhookSecretRotated, r.Err = c.RotateWebhookSecret(ctx, p.ID, opts...)
		}
	default:
		r.Err = fmt.Errorf("journalled operation %q has unknown action %q", e.Key, e.Action)
	}
	return r
}

// ErrJournalNotPrunable is returned by PruneJournal for a Journal that has
// no Prune method (FileJournal has one).
var ErrJournalNotPrunable = errors.New("the client's journal cannot be pruned")

// prunable is a Journal that forgets settled operations, as FileJournal
// does.
type prunable interface {
	Prune(ctx context.Context, settledBefore, expiredBefore time.Time, abandon bool) (PruneResult, error)
}

// PruneJournal prunes the client's journal by the key retention
// (Config.KeyRetention, else the server's from GET /v1/limits): it removes
// the records of operations settled longer ago than the retention and lists
// in Expired the unsettled ones first sent longer ago, which it keeps (they
// are never sent again, and only an explicit abandon, quill ops prune
// --abandon, removes them). Until the retention can be read nothing is
// pruned and the error wraps ErrLimitsUnavailable: a guessed horizon could
// forget a key the server still remembers. It returns ErrNoJournal or
// ErrJournalNotPrunable for a client without a prunable journal, and the
// journal's errors (records it cannot read, which it keeps).
func (c *Client) PruneJournal(ctx context.Context) (PruneResult, error) {
	if c.cfg.Journal == nil {
		return PruneResult{}, ErrNoJournal
	}
	p, ok := c.cfg.Journal.(prunable)
	if !ok {
		return PruneResult{}, ErrJournalNotPrunable
	}
	retention, err := c.keyRetention(ctx)
	if err != nil {
		return PruneResult{}, err
	}
	before := c.cfg.Now().Add(-retention)
	return p.Prune(ctx, before, before, false)
}
