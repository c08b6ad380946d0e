// Package validation is the one shape of a request's invalid fields: the
// domain packages (internal/notes, internal/webhooks) return an *Error
// naming every invalid field, and the API renders it, in one place, as the
// problem's errors member (400 validation_failed). It speaks no HTTP, so
// that the domain packages need not.
package validation

import (
	"fmt"
	"strings"
)

// FieldError names one invalid field of a request and what is wrong with
// it.
type FieldError struct {
	Field   string
	Message string
}

// Error lists every invalid field of a request, in the order found.
type Error struct {
	Errors []FieldError
}

// Error returns "validation failed: " and each field with its message.
func (e *Error) Error() string {
	parts := make([]string, len(e.Errors))
	for i, f := range e.Errors {
		parts[i] = f.Field + ": " + f.Message
	}
	return "validation failed: " + strings.Join(parts, "; ")
}

// Add records that field is invalid, its message formatted as by
// fmt.Sprintf.
func (e *Error) Add(field, format string, args ...any) {
	e.Errors = append(e.Errors, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Err returns e when it names a field, else nil: the one error a
// validator returns.
func (e *Error) Err() error {
	if len(e.Errors) == 0 {
		return nil
	}
	return e
}
