package idempotency

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quillhq/quill/internal/outbox"
)

// ErrInProgress: another request with the key is still executing.
var ErrInProgress = errors.New("operation in progress")

// KeyReusedError: the key is recorded for different parameters or another
// action.
type KeyReusedError struct {
	RecordedAction string
	Fields         []string
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("key is recorded for a %s operation with different parameters: %s",
		e.RecordedAction, strings.Join(e.Fields, ", "))
}

// ExpiredError: the key's response is past its retention; only the
// tombstone is left, and nothing is executed again.
type ExpiredError struct {
	Resource    string
	CompletedAt time.Time
	ExpiredAt   time.Time
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("the operation completed at %s; its response expired at %s",
		e.CompletedAt.UTC().Format(outbox.TimeFormat), e.ExpiredAt.UTC().Format(outbox.TimeFormat))
}

// UnavailableError: the database could not be used. Unknown says what is
// known: false when nothing was committed, true when the commit's reply was
// lost and a re-check could not tell.
type UnavailableError struct {
	Unknown bool
	Err     error
}

func (e *UnavailableError) Error() string {
	if e.Unknown {
		return "database unavailable; whether the operation committed is unknown: " + e.Err.Error()
	}
	return "database unavailable; nothing was committed: " + e.Err.Error()
}

func (e *UnavailableError) Unwrap() error { return e.Err }
