package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Retry pauses of the legitimate clients: Retry-After is honoured within
// these bounds, so that a server asking for minutes cannot stall a short
// benchmark and one asking for nothing is not hammered.
const (
	retryMin = 50 * time.Millisecond
	retryMax = 2 * time.Second
	// maxAnswer is the most of an answer read: notes are small; a bigger
	// answer is read no further (the connection is then not reused).
	maxAnswer = 1 << 20
)

// newHTTPClient is a client of conns keep-alive connections, made by d,
// that never goes through a proxy.
func newHTTPClient(d *net.Dialer, conns int, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// answer is what one request came back with.
type answer struct {
	status     int
	replayed   bool
	noteID     string
	retryAfter time.Duration
	err        error
}

// kind names an answer for the counts: "2xx", "http_429", "transport", ...
func (a answer) kind() string {
	switch {
	case a.err != nil:
		return "transport"
	case a.status >= 200 && a.status <= 299:
		return "2xx"
	}
	return "http_" + strconv.Itoa(a.status)
}

// retryable says a request may succeed when sent again under the same key:
// no answer at all, or one the SPEC answers with retry same_key (409, 429,
// 503) or any other server-side failure.
func (a answer) retryable() bool {
	return a.err != nil || a.status == http.StatusRequestTimeout || a.status == http.StatusConflict ||
		a.status == http.StatusTooManyRequests || a.status >= 500
}

// pause is how long to wait before sending again: Retry-After within
// [retryMin, retryMax].
func (a answer) pause() time.Duration { return min(max(a.retryAfter, retryMin), retryMax) }

// parseRetryAfter reads a Retry-After of delay-seconds (the form the API
// sends); 0 for anything else.
func parseRetryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// post sends one create and reads its answer; on a 2xx the note's id.
func post(ctx context.Context, hc *http.Client, endpoint, auth, key string, body []byte) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	return do(hc, req)
}

func do(hc *http.Client, req *http.Request) answer {
	resp, err := hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		a.err = err
		return a
	}
	if a.status >= 200 && a.status <= 299 {
		var n struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(b, &n) == nil {
			a.noteID = n.ID
		}
	}
	return a
}

// counts is a tally of answers by kind.
type counts map[string]int

func (c counts) total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

func (c counts) add(o counts) {
	for k, v := range o {
		c[k] += v
	}
}
