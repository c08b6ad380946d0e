// Command attachment-worker consumes note.created events from a durable JetStream
// consumer and processes their attachments once per event, through an inbox,
// with dead letters an operator can list and re-drive. See `attachment-worker --help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// usageError is a mistake in the command line or settings: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// loggedError has been logged already: exit 1 without repeating it.
type loggedError struct{ error }

func (e loggedError) Unwrap() error { return e.error }

func exitCode(err error, stderr io.Writer) int {
	var (
		uerr   usageError
		logged loggedError
	)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &logged):
		return 1
	case errors.As(err, &uerr):
		fmt.Fprintln(stderr, "attachment-worker:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "attachment-worker:", err)
		return 1
	}
}
