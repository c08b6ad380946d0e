// Package webhooktest runs, for tests, a webhook receiver that nobody at
// Quill wrote the verifier of: e2e/webhookreceiver, a small Node.js server
// that checks every delivery with the Standard Webhooks project's own npm
// package (standardwebhooks, pinned by its package-lock.json), answers 401
// to a bad signature, deduplicates by webhook-id and can be told to fail,
// answer 410, be slow, or accept a delivery and never answer (every one, or
// every Nth).
//
// Start installs the receiver's packages once (npm ci, skipped while
// node_modules matches the lock) and runs one receiver per call, stopped
// at the test's cleanup. Without node and npm the test is skipped, except
// under CI=true, where .ci/run has installed them and a skip would hide a
// missing install step. It is imported only from _test.go files.
package webhooktest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Install is what to do on a machine without node and npm.
const Install = "apt-get install -y nodejs npm (.ci/run does it when they are missing)"

// startTimeout bounds the wait for the receiver's first line; node starts
// in well under a second, but CI runs it beside the race detector.
const startTimeout = 30 * time.Second

// stopTimeout bounds a graceful stop after SIGTERM.
const stopTimeout = 10 * time.Second

// Receiver is one running receiver.
type Receiver struct {
	// URL is the receiver's base address, "http://127.0.0.1:<port>". A POST
	// to any path but /stats, /events and /control is a delivery.
	URL string

	client *http.Client
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{}
	err    error // cmd.Wait's, set before exited is closed
}

// Stats is what the receiver counted (GET /stats).
type Stats struct {
	// Accepted counts the ids recorded: one effect each.
	Accepted int `json:"accepted"`
	// Duplicates counts verified deliveries of an id already recorded.
	Duplicates int `json:"duplicates"`
	// Rejected counts deliveries no configured secret verified (401).
	Rejected int `json:"rejected"`
	// BadRequests counts deliveries missing a header, with a body over
	// 1 MiB, or signed but not JSON (400, 413).
	BadRequests int `json:"bad_requests"`
	// Failed counts deliveries answered Faults.FailStatus on purpose.
	Failed int `json:"failed"`
	// Gone counts deliveries answered 410 on purpose.
	Gone int `json:"gone"`
	// Held counts deliveries recorded and never answered (Faults.Hang,
	// Faults.HangEvery).
	Held int `json:"held"`
	// Holding counts the held requests still open now: a sender is in the
	// middle of a delivery, waiting for its answer.
	Holding int `json:"holding"`
	// IDs counts the recorded deliveries of each id (first and duplicates).
	IDs map[string]int `json:"ids"`
}

// Event is an accepted delivery, the first of its id (GET /events).
type Event struct {
	ID         string          `json:"id"`
	Timestamp  string          `json:"timestamp"`
	ReceivedAt time.Time       `json:"received_at"`
	Path       string          `json:"path"`
	Body       json.RawMessage `json:"body"`
}

// Faults is how the receiver misbehaves; the zero value is a healthy
// receiver. Verification comes first: a bad signature is answered 401
// whatever the faults.
type Faults struct {
	// FailNext answers the next FailNext verified deliveries FailStatus,
	// without recording them.
	FailNext int
	// FailStatus is the status of those answers; 0 means 500.
	FailStatus int
	// Gone answers every verified delivery 410, without recording it.
	Gone bool
	// Hang records each verified delivery and then never answers it: the
	// sender's timeout ends the request, an unknown outcome for it, while
	// the receiver has the effect.
	Hang bool
	// HangEvery, when Hang is false, records every delivery and never
	// answers every HangEvery-th of them (counted from this Control): the
	// receiver accepts some requests and hangs on others, past the
	// sender's timeout. 0 is off.
	HangEvery int
	// Delay holds each recorded delivery's 200 this long.
	Delay time.Duration
}

// Start runs a receiver that accepts deliveries signed by any of secrets
// (whsec_ form; two during a rotation) and stops it at t's cleanup, where
// it fails t if the receiver exited on its own or did not stop cleanly.
// Without secrets it refuses every delivery (401) until SetSecrets: a test
// that registers an endpoint at the receiver's URL learns the secret only
// from that registration. It skips t (fails it under CI=true) when node or
// npm is missing or the install fails.
func Start(t testing.TB, secrets ...string) *Receiver {
	t.Helper()
	dir, err := prepare(t)
	if err != nil {
		if os.Getenv("CI") == "true" {
			require.FailNow(t, "the webhook receiver cannot run", "%v", err)
		}
		t.Skipf("the webhook receiver cannot run: %v", err)
	}

	first := &firstLine{ch: make(chan string, 1)}
	r := &Receiver{
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}},
		stderr: &lockedBuffer{},
		exited: make(chan struct{}),
	}
	r.cmd = exec.Command("node", "server.mjs")
	r.cmd.Dir = dir
	// Only what the receiver reads: a RECEIVER_* of the caller's
	// environment must not change a test.
	r.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"RECEIVER_SECRETS=" + strings.Join(secrets, ","),
		"RECEIVER_PORT=0",
	}
	r.cmd.Stdout = first
	r.cmd.Stderr = r.stderr
	r.cmd.SysProcAttr = sysProcAttr()
	r.cmd.WaitDelay = stopTimeout
	require.NoError(t, r.cmd.Start(), "start node server.mjs in %s", dir)
	go func() {
		r.err = r.cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() { r.stop(t) })

	select {
	case line := <-first.ch:
		var ready struct {
			URL string `json:"url"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &ready), "the receiver's first line %q is not its address; stderr: %s", line, r.stderr)
		require.True(t, strings.HasPrefix(ready.URL, "http://"), "the receiver's first line %q", line)
		r.URL = ready.URL
	case <-r.exited:
		require.FailNow(t, "the webhook receiver exited at start", "%v; stderr: %s", r.err, r.stderr)
	case <-time.After(startTimeout):
		require.FailNow(t, "the webhook receiver did not print its address", "after %s; stderr: %s", startTimeout, r.stderr)
	}
	return r
}

// stop sends SIGTERM and waits for a clean exit.
func (r *Receiver) stop(t testing.TB) {
	r.client.CloseIdleConnections()
	select {
	case <-r.exited:
		t.Errorf("the webhook receiver exited before the test ended: %v; stderr: %s", r.err, r.stderr)
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
		if r.err != nil {
			t.Errorf("the webhook receiver did not stop cleanly on SIGTERM: %v; stderr: %s", r.err, r.stderr)
		}
	case <-time.After(stopTimeout):
		_ = r.cmd.Process.Kill()
		<-r.exited
		t.Errorf("the webhook receiver did not stop within %s of SIGTERM; stderr: %s", stopTimeout, r.stderr)
	}
	if t.Failed() {
		t.Logf("webhook receiver's log:\n%s", r.stderr)
	}
}

// Stats returns the receiver's counts, failing t when it does not answer.
// Call it from the test's goroutine.
func (r *Receiver) Stats(t testing.TB) Stats {
	t.Helper()
	var s Stats
	r.get(t, "/stats", &s)
	return s
}

// Events returns the accepted deliveries, the first of each id in the
// order they were accepted, failing t when the receiver does not answer.
func (r *Receiver) Events(t testing.TB) []Event {
	t.Helper()
	var evs []Event
	r.get(t, "/events", &evs)
	return evs
}

// Control replaces the receiver's faults with f (Faults{} heals it),
// failing t when the receiver refuses them.
func (r *Receiver) Control(t testing.TB, f Faults) {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"fail_next":   f.FailNext,
		"fail_status": cmp.Or(f.FailStatus, http.StatusInternalServerError),
		"gone":        f.Gone,
		"hang":        f.Hang,
		"hang_every":  f.HangEvery,
		"delay_ms":    f.Delay.Milliseconds(),
	})
	require.NoError(t, err)
	r.control(t, body)
}

// SetSecrets replaces the secrets the receiver verifies with (a rotation:
// the new one alone, to prove the sender signs with it), failing t when
// the receiver refuses one. The faults stay as they are.
func (r *Receiver) SetSecrets(t testing.TB, secrets ...string) {
	t.Helper()
	if secrets == nil {
		secrets = []string{}
	}
	body, err := json.Marshal(map[string]any{"secrets": secrets})
	require.NoError(t, err)
	r.control(t, body)
}

func (r *Receiver) control(t testing.TB, body []byte) {
	t.Helper()
	resp, err := r.client.Post(r.URL+"/control", "application/json", bytes.NewReader(body))
	require.NoError(t, err, "POST /control")
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "POST /control: %s", got)
}

func (r *Receiver) get(t testing.TB, path string, v any) {
	t.Helper()
	resp, err := r.client.Get(r.URL + path)
	require.NoError(t, err, "GET %s", path)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s", path)
	dec := json.NewDecoder(resp.Body)
	// The receiver and this package must agree on every field.
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), "GET %s", path)
}

// firstLine is the receiver's stdout: it hands the first line over and
// drops the rest.
type firstLine struct {
	mu   sync.Mutex
	buf  []byte
	done bool
	ch   chan string
}

func (w *firstLine) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	if i := bytes.IndexByte(w.buf, '\n'); i >= 0 {
		w.done = true
		w.ch <- string(w.buf[:i])
		w.buf = nil
	}
	return len(p), nil
}

// lockedBuffer is the receiver's stderr, read by the test while the
// process writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// errMissing says which tool is not installed.
var errMissing = errors.New("not installed")

func missing(tool string) error {
	return fmt.Errorf("%s is %w (%s)", tool, errMissing, Install)
}
