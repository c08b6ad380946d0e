package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	prob := func(status int, code, retry string) *Problem {
		return &Problem{Status: status, Code: code, Retry: retry}
	}
	for _, tc := range []struct {
		name   string
		parent context.Context
		status int
		prob   *Problem
		err    error
		want   verdict
	}{
		{"201 created", live, 201, nil, nil, verdictDone},
		{"200 deleted", live, 200, nil, nil, verdictDone},
		{"422 key reused is final", live, 422, prob(422, "idempotency_key_reused", contract.RetryNo), nil, verdictRefused},
		{"400 validation is final", live, 400, prob(400, "validation_failed", contract.RetryAfterFixing), nil, verdictRefused},
		{"401 is final", live, 401, prob(401, "unauthenticated", contract.RetryAfterFixing), nil, verdictRefused},
		{"404 is final", live, 404, prob(404, "not_found", contract.RetryNo), nil, verdictRefused},
		{"410 expired is final", live, 410, prob(410, "operation_result_expired", contract.RetryNo), nil, verdictRefused},
		{"409 in progress is retried", live, 409, prob(409, "operation_in_progress", contract.RetrySameKey), nil, verdictRetry},
		{"503 unavailable is retried", live, 503, prob(503, "unavailable", contract.RetrySameKey), nil, verdictRetry},
		{"500 problem with same_key is retried", live, 500, prob(500, "internal_error", contract.RetrySameKey), nil, verdictRetry},
		{"502 without a body is unknown", live, 502, nil, nil, verdictRetry},
		{"500 without a problem is unknown", live, 500, nil, nil, verdictRetry},
		{"429 without a problem is retried", live, 429, nil, nil, verdictRetry},
		{"404 without a problem is final", live, 404, nil, nil, verdictRefused},
		{"timeout is unknown", live, 0, nil, context.DeadlineExceeded, verdictRetry},
		{"reset after sending is unknown", live, 0, nil, reset, verdictRetry},
		{"EOF after sending is unknown", live, 0, nil, io.ErrUnexpectedEOF, verdictRetry},
		{"refused connection was never sent", live, 0, nil, fmt.Errorf("post: %w", dial), verdictRetryUnsent},
		{"DNS failure was never sent", live, 0, nil, &net.DNSError{Err: "no such host"}, verdictRetryUnsent},
		{"caller cancelled stops", cancelled, 0, nil, context.Canceled, verdictStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, classify(tc.parent, tc.status, tc.prob, tc.err))
		})
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	const base, max = 100 * time.Millisecond, 1 * time.Second
	almostOne := func() float64 { return 0.999999 }
	zero := func() float64 { return 0 }
	for _, tc := range []struct {
		n       int
		rnd     func() float64
		atMost  time.Duration
		atLeast time.Duration
	}{
		{0, almostOne, 0, 0},
		{1, almostOne, base, base - time.Millisecond},
		{2, almostOne, 2 * base, 2*base - time.Millisecond},
		{3, almostOne, 4 * base, 4*base - time.Millisecond},
		{4, almostOne, 8 * base, 8*base - time.Millisecond},
		{5, almostOne, max, max - time.Millisecond},  // capped
		{60, almostOne, max, max - time.Millisecond}, // no overflow
		{3, zero, 0, 0}, // full jitter reaches zero
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			t.Parallel()
			d := backoff(tc.n, base, max, tc.rnd)
			require.LessOrEqual(t, d, tc.atMost)
			require.GreaterOrEqual(t, d, tc.atLeast)
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 10, 14, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"2", 2 * time.Second},
		{" 1 ", time.Second},
		{"0", 0},
		{"-3", 0},
		{"soon", 0},
		{"999999999", 24 * time.Hour},
		{now.Add(5 * time.Second).Format(http.TimeFormat), 5 * time.Second},
		{now.Add(-5 * time.Second).Format(http.TimeFormat), 0},
	} {
		require.Equal(t, tc.want, parseRetryAfter(tc.in, now), "Retry-After %q", tc.in)
	}
}

func TestUnknownOutcomeErrorCarriesTheKey(t *testing.T) {
	t.Parallel()
	err := error(&UnknownOutcomeError{Key: "k-1", Action: contract.ActionCreateNote, Attempts: 3, Lookup: "failed", Cause: context.DeadlineExceeded})
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "outcome unknown")
	require.Contains(t, err.Error(), `"k-1"`)
	var u *UnknownOutcomeError
	require.True(t, errors.As(err, &u))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Token: "x"}, "BaseURL"},
		{Config{BaseURL: "ftp://x", Token: "x"}, "BaseURL"},
		{Config{BaseURL: "http://x"}, "token"},
		{Config{BaseURL: "http://x", Token: "x", Attempts: -1}, "attempts"},
		{Config{BaseURL: "http://x", Token: "x", Deadline: -time.Second}, "negative"},
		{Config{BaseURL: "http://x", Token: "x", MaxRetryAfter: -time.Second}, "negative"},
	} {
		_, err := New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	c, err := New(Config{BaseURL: "http://x/", Token: "x"})
	require.NoError(t, err)
	require.Zero(t, c.Config().KeyRetention, "unset: the server's is read")
	require.Equal(t, 5, c.Config().Attempts)
}
