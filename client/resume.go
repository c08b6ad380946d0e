package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Resumed is the result of resuming one journalled operation.
type Resumed struct {
	// Entry is the journalled operation.
	Entry JournalEntry
	// Created or Deleted is the answer when the operation completed.
	Created *Created
	Deleted *Deleted
	// Err is why it did not complete: a *RefusedError (settled, final),
	// an *UnknownOutcomeError (still unsettled), ErrKeyTooOld, or another
	// error.
	Err error
}

// ErrNoJournal is returned by Resume for a client without a Journal.
var ErrNoJournal = errors.New("the client has no journal")

// Resume sends every unsettled journalled operation again, under its
// original key and with its original parameters, and settles it in the
// journal when its outcome is known. Operations are resumed one at a time,
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
	out := make([]Resumed, 0, len(entries))
	for _, e := range entries {
		if ctx.Err() != nil {
			break
		}
		r := Resumed{Entry: e}
		opts := []WriteOption{WithKey(e.Key), WithFirstSent(e.CreatedAt)}
		switch e.Action {
		case ActionCreateNote:
			var n NewNote
			if err := json.Unmarshal(e.Params, &n); err != nil {
				r.Err = fmt.Errorf("journalled parameters of %q: %w", e.Key, err)
				break
			}
			r.Created, r.Err = c.CreateNote(ctx, n, opts...)
		case ActionDeleteNote:
			var p deleteParams
			if err := json.Unmarshal(e.Params, &p); err != nil {
				r.Err = fmt.Errorf("journalled parameters of %q: %w", e.Key, err)
				break
			}
			r.Deleted, r.Err = c.DeleteNote(ctx, p.ID, opts...)
		default:
			r.Err = fmt.Errorf("journalled operation %q has unknown action %q", e.Key, e.Action)
		}
		out = append(out, r)
	}
	return out, jerr
}
