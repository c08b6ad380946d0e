package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestTranslate(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		name string
		err  error
		is   []error
		not  []error
	}{
		{"no rows", pgx.ErrNoRows, []error{ErrNotFound}, []error{ErrUnavailable}},
		{"unique violation", pg(pgerrcode.UniqueViolation), []error{ErrDuplicate, ErrConflict}, []error{ErrUnavailable}},
		{"serialization failure", pg(pgerrcode.SerializationFailure), []error{ErrConflict}, []error{ErrDuplicate}},
		{"deadlock", pg(pgerrcode.DeadlockDetected), []error{ErrConflict}, []error{ErrDuplicate}},
		{"admin shutdown", pg(pgerrcode.AdminShutdown), []error{ErrUnavailable}, []error{ErrConflict}},
		{"too many connections", pg(pgerrcode.TooManyConnections), []error{ErrUnavailable}, nil},
		{"connection failure", pg(pgerrcode.ConnectionFailure), []error{ErrUnavailable}, nil},
		{"other server error", pg(pgerrcode.UndefinedTable), nil, []error{ErrUnavailable, ErrConflict, ErrNotFound}},
		{"unexpected EOF", fmt.Errorf("receive message failed: %w", io.ErrUnexpectedEOF), []error{ErrUnavailable}, nil},
		{"EOF", fmt.Errorf("read: %w", io.EOF), []error{ErrUnavailable}, nil},
		{"reset", &net.OpError{Op: "read", Err: syscall.ECONNRESET}, []error{ErrUnavailable}, nil},
		{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), []error{ErrUnavailable}, nil},
		{"closed socket", fmt.Errorf("write: %w", net.ErrClosed), []error{ErrUnavailable}, nil},
		{"closed conn", fmt.Errorf("exec: %w", pgconn.ErrConnClosed), []error{ErrUnavailable}, nil},
		{"deadline", context.DeadlineExceeded, []error{ErrUnavailable}, nil},
		{"plain error", errors.New("EOF-like message but not a connection error"), nil, []error{ErrUnavailable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Translate(tc.err)
			require.ErrorIs(t, got, tc.err, "the original stays in the chain")
			for _, want := range tc.is {
				require.ErrorIs(t, got, want)
			}
			for _, not := range tc.not {
				require.NotErrorIs(t, got, not)
			}
		})
	}
	require.NoError(t, Translate(nil))
}

func TestSessionEnded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		e    pgconn.PgError
		want bool
	}{
		{pgconn.PgError{Severity: "FATAL", Code: pgerrcode.IdleInTransactionSessionTimeout}, true},
		{pgconn.PgError{Severity: "ERROR", Code: pgerrcode.AdminShutdown}, true},
		{pgconn.PgError{Severity: "ERROR", Code: pgerrcode.ConnectionFailure}, true},
		{pgconn.PgError{Severity: "ERROR", Code: pgerrcode.QueryCanceled}, false},
		{pgconn.PgError{Severity: "ERROR", Code: pgerrcode.UniqueViolation}, false},
	} {
		require.Equal(t, tc.want, sessionEnded(&tc.e), "%s %s", tc.e.Severity, tc.e.Code)
	}
}
