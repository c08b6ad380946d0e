package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"time"
)

// Results of quill_webhook_deliveries_total, one per attempt.
const (
	// ResultDelivered: a 2xx answer.
	ResultDelivered = "delivered"
	// ResultRetried: another answer, a timeout or a connection error; the
	// delivery is attempted again after its backoff.
	ResultRetried = "retried"
	// ResultFailed: the attempt ended the delivery as failed — past
	// QUILL_WEBHOOK_RETRY_FOR, a 410 Gone, the endpoint disabled.
	ResultFailed = "failed"
	// ResultRefused: nothing was sent — the URL is not https or its
	// address is not public (SSRF); retried like a failure.
	ResultRefused = "refused"
)

// Results are the results of quill_webhook_deliveries_total.
var Results = []string{ResultDelivered, ResultRetried, ResultFailed, ResultRefused}

// verdict is what one attempt's outcome means for the delivery.
type verdict int

const (
	// delivered: 2xx.
	delivered verdict = iota
	// retry: try again after the backoff (or fail past the horizon).
	retry
	// gone: 410, the endpoint disabled at once and the delivery failed.
	gone
)

// attempt is one POST's outcome: the status (0 when none came) and the
// error (a transport error, a refusal).
type attempt struct {
	status int
	err    error
}

// classify says what an attempt means: a 2xx delivers, a 410 disables the
// endpoint, everything else — another status (a 3xx too: redirects are not
// followed), a timeout, a refused connection, an SSRF refusal — is retried.
func classify(a attempt) verdict {
	switch {
	case a.err != nil:
		return retry
	case a.status >= 200 && a.status < 300:
		return delivered
	case a.status == http.StatusGone:
		return gone
	}
	return retry
}

// refused reports whether the attempt sent nothing because of the SSRF rules.
func (a attempt) refused() bool {
	var r *RefusedError
	return errors.As(a.err, &r)
}

// describe is the attempt's last_error: "" for a 2xx.
func (a attempt) describe() string {
	var r *RefusedError
	var ne net.Error
	switch {
	case errors.As(a.err, &r):
		return r.Error()
	case errors.Is(a.err, context.DeadlineExceeded) || errors.As(a.err, &ne) && ne.Timeout():
		return "timeout: no answer within QUILL_WEBHOOK_TIMEOUT (the outcome is unknown; sent again under the same webhook-id)"
	case a.err != nil:
		return truncate(a.err.Error(), 500)
	case a.status >= 200 && a.status < 300:
		return ""
	case a.status >= 300 && a.status < 400:
		return fmt.Sprintf("HTTP %d: redirects are not followed", a.status)
	}
	return fmt.Sprintf("HTTP %d", a.status)
}

// backoff is the delay before the attempt after the attempts-th: full
// jitter, uniform in [0, min(max, base·2^(attempts-1))], never below base
// (so a failing endpoint is not hammered). r returns a float in [0, 1).
func backoff(attempts int, base, maxDelay time.Duration, r func() float64) time.Duration {
	ceil := base
	for i := 1; i < attempts && ceil < maxDelay; i++ {
		ceil *= 2
	}
	ceil = min(ceil, maxDelay)
	if ceil <= base {
		return base
	}
	return base + time.Duration(r()*float64(ceil-base))
}

// jitter is backoff's random source.
func jitter() float64 { return rand.Float64() }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
