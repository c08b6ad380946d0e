package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quillhq/quill/contract"
)

// verdict is what one attempt's answer means for the operation.
type verdict int

const (
	// verdictDone: a 2xx; the operation completed.
	verdictDone verdict = iota
	// verdictRefused: a final answer; sending again cannot help.
	verdictRefused
	// verdictRetry: send again with the same key; the request may have
	// executed (unknown) or been declined for now (409, 503).
	verdictRetry
	// verdictRetryUnsent: send again; this request never reached the
	// server (the connection could not be made).
	verdictRetryUnsent
	// verdictStop: the caller's context ended; stop without retrying.
	verdictStop
)

func (v verdict) String() string {
	return [...]string{"done", "refused", "retry", "retry-unsent", "stop"}[v]
}

// classify decides what an attempt's outcome means. transportErr is the
// error of sending the request and reading its answer (nil when an answer
// arrived); prob is the answer's problem document, when it had one;
// parent is the caller's context (not the attempt's), to tell a caller's
// cancellation from an attempt's timeout.
func classify(parent context.Context, status int, prob *Problem, transportErr error) verdict {
	if transportErr != nil {
		if parent.Err() != nil {
			return verdictStop
		}
		if notSent(transportErr) {
			return verdictRetryUnsent
		}
		// A timeout, a reset or EOF after the request was written: the
		// server may have executed it.
		return verdictRetry
	}
	switch {
	case status >= 200 && status < 300:
		return verdictDone
	case prob != nil && prob.Code != "":
		if prob.Retry == contract.RetrySameKey {
			return verdictRetry
		}
		return verdictRefused
	case status >= 500, status == http.StatusTooManyRequests, status == http.StatusRequestTimeout:
		// No problem document: a proxy or a crashed server answered,
		// and nobody says whether the request executed.
		return verdictRetry
	default:
		return verdictRefused
	}
}

// notSent reports whether err shows that the request never left the
// client: the connection could not be made (refused, no route, DNS).
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// backoff is the delay before retry number n (n = 1 for the first retry):
// full jitter, uniformly random in [0, min(max, base·2^(n-1))). rnd returns
// a number in [0, 1).
func backoff(n int, base, max time.Duration, rnd func() float64) time.Duration {
	if n < 1 || base <= 0 {
		return 0
	}
	ceiling := base
	for i := 1; i < n && ceiling < max; i++ {
		ceiling *= 2
	}
	if ceiling > max {
		ceiling = max
	}
	return time.Duration(rnd() * float64(ceiling))
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (RFC 9110 §10.2.3). It returns 0 for an absent or malformed value.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > 86400 {
			n = 86400
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
