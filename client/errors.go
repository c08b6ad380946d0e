package client

import (
	"errors"
	"fmt"
)

// ErrOutcomeUnknown is wrapped by every UnknownOutcomeError, for errors.Is.
var ErrOutcomeUnknown = errors.New("outcome unknown")

// ErrKeyTooOld is returned, before anything is sent, for a key first sent
// longer ago than Config.KeyRetention: the server may have forgotten it, and
// a resend could execute the operation a second time.
var ErrKeyTooOld = errors.New("operation key is older than the server's key retention")

// UnknownOutcomeError says that a write may or may not have happened:
// attempts or the deadline ran out after a request that may have reached the
// server, and the outcome lookup could not settle it. The operation is not
// failed: look it up, or send it again, with Key — never with a new key.
type UnknownOutcomeError struct {
	// Key is the operation key to look up or resend with.
	Key string
	// Action is one of contract.Actions: create-note, update-note,
	// delete-note, create-webhook, delete-webhook, rotate-webhook-secret.
	Action string
	// Attempts is the number of requests sent.
	Attempts int
	// Lookup says what the final lookup found: "in_progress" (the server
	// is still executing it), "not_found" (nothing recorded when it was
	// asked; an earlier request may still arrive), "failed" (the lookup
	// itself got no answer), or, for a webhook create or rotation only,
	// "completed": it executed, but the answer carrying its secret was not
	// received (Cause wraps ErrSecretNotReceived) — resend it under Key to
	// have the answer replayed.
	Lookup string
	// Cause is the last attempt's error.
	Cause error
}

func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("outcome unknown for operation key %q (%s, %d attempts, lookup %s): %v; "+
		"look it up or resend with the same key, never a new one", e.Key, e.Action, e.Attempts, e.Lookup, e.Cause)
}

// Unwrap returns ErrOutcomeUnknown and the cause.
func (e *UnknownOutcomeError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.Cause} }

// RefusedError is a write's final answer from the server: its Problem's
// retry advice is after_fixing or no, so sending it again with the same key
// and parameters cannot succeed.
type RefusedError struct {
	// Key is the operation key the write was sent under.
	Key string
	// Replayed is true when the refusal is a recorded one (a replay).
	Replayed bool
	// Problem is the server's answer.
	Problem *Problem
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused (operation key %q): %v", e.Key, e.Problem)
}

// Unwrap returns the Problem.
func (e *RefusedError) Unwrap() error { return e.Problem }
