package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
)

// TestRateSchedulesRequests: with --rate the requests follow the schedule —
// about rate × duration of them, whatever the concurrency — and the result
// says which rate was asked for.
func TestRateSchedulesRequests(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	var out, errOut bytes.Buffer
	args := []string{"--url", srv.URL, "--token", "t", "--concurrency", "8", "--rate", "200",
		"--duration", "1s", "--warmup", "0s", "--json"}
	if err := run(t.Context(), args, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("run: %v (%s)", err, errOut.String())
	}
	var res result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	if res.TargetRate != 200 {
		t.Errorf("target_rate = %v, want 200", res.TargetRate)
	}
	// 200 slots fall in the second; allow for a slow machine at the end.
	if res.OK < 180 || res.OK > 201 || n.Load() > 201 {
		t.Errorf("ok = %d, server saw %d; want about 200", res.OK, n.Load())
	}
	if res.MaxSendLagMs > float64(500*time.Millisecond/time.Millisecond) {
		t.Errorf("max send lag %v ms", res.MaxSendLagMs)
	}
}

func TestRateMustNotBeNegative(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--token", "t", "--rate", "-1"}, func(string) string { return "" }, &out, &errOut)
	var uerr cli.UsageError
	if !errors.As(err, &uerr) {
		t.Fatalf("err = %v, want a usage error", err)
	}
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"--version"}, func(string) string { return "" }, &stdout, &stderr))
	require.True(t, strings.HasPrefix(stdout.String(), "loadgen "), stdout.String())
	require.Empty(t, stderr.String())
}

// TestSeedCreatesCountNotesWithAttachment: seed mode sends exactly --count
// creates, each with the named fixture as its attachment, and exits.
func TestSeedCreatesCountNotesWithAttachment(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	var bad atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		var body struct {
			Title      string `json:"title"`
			Attachment *struct {
				ContentType string `json:"content_type"`
				Data        []byte `json:"data"`
			} `json:"attachment"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Attachment == nil ||
			body.Attachment.ContentType != "image/png" || len(body.Attachment.Data) < 1000 {
			bad.Store(fmt.Sprintf("body: %v, attachment %+v", err, body.Attachment))
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	var out, errOut bytes.Buffer
	args := []string{"--url", srv.URL, "--token", "t", "--concurrency", "4", "--mode", "seed", "--count", "37",
		"--attachment", "png64k", "--json"}
	require.NoError(t, run(t.Context(), args, func(string) string { return "" }, &out, &errOut), errOut.String())
	require.Nil(t, bad.Load())
	require.EqualValues(t, 37, n.Load())
	var res struct {
		Created int `json:"created"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	require.Equal(t, 37, res.Created)
}

func TestUnknownAttachmentIsAUsageError(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--token", "t", "--attachment", "gif"}, func(string) string { return "" }, &out, &errOut)
	var uerr cli.UsageError
	require.ErrorAs(t, err, &uerr)
}

// notesServer is a fake of the API's create and update for the update
// mode's tests: POST creates a note at version 1 (ETag "1"), PATCH applies
// an update made against the note's version (200, ETag one more) and
// answers any other If-Match 412 with current_version. Every key must be
// new. bump, when set, is called before each PATCH is decided and may move
// the note's version itself (another writer).
type notesServer struct {
	mu       sync.Mutex
	versions map[string]int // note id → version
	keys     map[string]bool
	patches  int
	bad      []string
	bump     func(id string, n int) bool
}

func newNotesServer() *notesServer {
	return &notesServer{versions: map[string]int{}, keys: map[string]bool{}}
}

func (s *notesServer) fail(format string, args ...any) {
	s.bad = append(s.bad, fmt.Sprintf(format, args...))
}

func (s *notesServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	if key == "" || s.keys[key] {
		s.fail("%s %s: key %q missing or reused", r.Method, r.URL.Path, key)
	}
	s.keys[key] = true
	var in map[string]any
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		s.fail("%s body: %v", r.Method, err)
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/notes":
		id := fmt.Sprintf("0190a000-0000-7000-8000-%012d", len(s.versions))
		s.versions[id] = 1
		w.Header().Set("ETag", `"1"`)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"title":"t","body":"b","version":1}`, id)
	case r.Method == http.MethodPatch && strings.HasPrefix(r.URL.Path, "/v1/notes/"):
		id := strings.TrimPrefix(r.URL.Path, "/v1/notes/")
		v, ok := s.versions[id]
		if !ok {
			s.fail("PATCH of unknown note %s", id)
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if _, ok := in["title"].(string); !ok {
			s.fail("PATCH without a title: %v", in)
		}
		s.patches++
		if s.bump != nil && s.bump(id, s.patches) {
			v++
			s.versions[id] = v
		}
		if r.Header.Get("If-Match") != fmt.Sprintf(`"%d"`, v) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusPreconditionFailed)
			fmt.Fprintf(w, `{"code":"precondition_failed","current_version":%d}`, v)
			return
		}
		s.versions[id] = v + 1
		w.Header().Set("ETag", fmt.Sprintf(`"%d"`, v+1))
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"id":%q,"version":%d}`, id, v+1)
	default:
		s.fail("unexpected %s %s", r.Method, r.URL.Path)
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func runUpdate(t *testing.T, srv *httptest.Server, concurrency int) result {
	t.Helper()
	var out, errOut bytes.Buffer
	args := []string{"--url", srv.URL, "--token", "t", "--mode", "update", "--concurrency", strconv.Itoa(concurrency),
		"--duration", "300ms", "--warmup", "100ms", "--json"}
	require.NoError(t, run(t.Context(), args, func(string) string { return "" }, &out, &errOut), errOut.String())
	var res result
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	return res
}

// TestUpdateFollowsItsOwnNotesETag: update mode creates one note per client
// before measuring, then each client updates its own note under a new key
// each time, with If-Match the ETag its previous answer carried — so no
// update is refused (412) and every note ends at 1 + its updates.
func TestUpdateFollowsItsOwnNotesETag(t *testing.T) {
	t.Parallel()
	fake := newNotesServer()
	srv := httptest.NewServer(fake)
	defer srv.Close()

	res := runUpdate(t, srv, 4)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	require.Empty(t, fake.bad)
	require.Equal(t, "update", res.Mode)
	require.Equal(t, 4, res.Notes)
	require.Len(t, fake.versions, 4)
	require.Positive(t, res.OK)
	require.Zero(t, res.Errors, res.ErrorKinds)
	require.Zero(t, res.PreconditionFailed)
	total := 0
	for _, v := range fake.versions {
		total += v - 1
	}
	// Every PATCH was accepted; the measured ones are a part of them.
	require.Equal(t, fake.patches, total)
	require.LessOrEqual(t, res.OK, total)
}

// TestUpdateCountsPreconditionFailedAndRecovers: when another writer moves
// a note, the client's next update is refused 412; the run counts it and
// goes on from the current_version the 412 named.
func TestUpdateCountsPreconditionFailedAndRecovers(t *testing.T) {
	t.Parallel()
	fake := newNotesServer()
	fake.bump = func(_ string, n int) bool { return n%10 == 0 }
	srv := httptest.NewServer(fake)
	defer srv.Close()

	res := runUpdate(t, srv, 2)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	require.Empty(t, fake.bad)
	require.Positive(t, res.PreconditionFailed)
	require.Equal(t, res.PreconditionFailed, res.Errors, res.ErrorKinds)
	require.Contains(t, res.ErrorKinds, "http_412=")
	// Recovered: far more accepted updates than refusals (one in ten).
	require.Greater(t, res.OK, 5*res.PreconditionFailed)
}

// TestUpdateNotAdvancingIsAnError: a 200 whose ETag is not the next version
// (an update that changed nothing) does not count as an update.
func TestUpdateNotAdvancingIsAnError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"1"`)
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"0190a000-0000-7000-8000-000000000001"}`)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()

	var out, errOut bytes.Buffer
	args := []string{"--url", srv.URL, "--token", "t", "--mode", "update", "--concurrency", "1",
		"--duration", "100ms", "--warmup", "0s", "--json"}
	err := run(t.Context(), args, func(string) string { return "" }, &out, &errOut)
	require.Error(t, err) // no request succeeded
	var res result
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	require.Zero(t, res.OK)
	require.Contains(t, res.ErrorKinds, "version_not_advanced=")
}
