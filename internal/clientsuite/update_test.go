package clientsuite_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/faultproxy"
)

func ptr(s string) *string { return &s }

const someID = "0193aaaa-0000-7000-8000-000000000001"

// An update that cannot be sent as asked — no version, a version out of
// range, nothing to change — is an error before anything is journalled or
// sent, as is a delete's version out of range.
func TestUpdateArgumentsAreRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { requests.Add(1) }))
	t.Cleanup(srv.Close)
	j, err := client.OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	c, err := client.New(client.Config{BaseURL: srv.URL, Token: "t", Journal: j})
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		version int
		fields  client.NoteUpdate
		want    string
	}{
		{"version 0", 0, client.NoteUpdate{Title: ptr("x")}, "if-version 0"},
		{"negative version", -1, client.NoteUpdate{Title: ptr("x")}, "if-version -1"},
		{"version too large", client.MaxVersion + 1, client.NoteUpdate{Title: ptr("x")}, "if-version 2147483648"},
		{"nothing to change", 1, client.NoteUpdate{}, "nothing to change"},
	} {
		_, err := c.UpdateNote(t.Context(), someID, tc.version, tc.fields, "k-"+strings.ReplaceAll(tc.name, " ", "-"))
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err = c.DeleteNoteIfVersion(t.Context(), someID, 0)
	require.ErrorContains(t, err, "if-version 0")
	require.Zero(t, requests.Load())
	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Empty(t, un, "nothing was journalled")
}

// An update is journalled — key, action and parameters — before its first
// send: a process that never reaches the server leaves it to resume.
func TestUpdateIsJournalledBeforeItsFirstSend(t *testing.T) {
	t.Parallel()
	j, err := client.OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	c, err := client.New(client.Config{BaseURL: "http://127.0.0.1:1", Token: "t", Journal: j, Attempts: 1, Deadline: 2 * time.Second})
	require.NoError(t, err)
	_, err = c.UpdateNote(t.Context(), someID, 3, client.NoteUpdate{Body: ptr("")}, "upd-journal-1")
	var u *client.UnknownOutcomeError
	require.ErrorAs(t, err, &u)
	require.Equal(t, "upd-journal-1", u.Key)
	require.Equal(t, contract.ActionUpdateNote, u.Action)
	require.Equal(t, "not_sent", u.Lookup)
	e, err := j.Get(t.Context(), "upd-journal-1")
	require.NoError(t, err)
	require.Equal(t, contract.ActionUpdateNote, e.Action)
	require.JSONEq(t, `{"id":"`+someID+`","if_version":3,"body":""}`, string(e.Params))
	require.Nil(t, e.Settled)

	_, err = c.DeleteNoteIfVersion(t.Context(), someID, 4, client.WithKey("del-journal-1"))
	require.ErrorAs(t, err, &u)
	e, err = j.Get(t.Context(), "del-journal-1")
	require.NoError(t, err)
	require.JSONEq(t, `{"id":"`+someID+`","if_version":4}`, string(e.Params))
}

// wireRequest is what the stand-in server saw of one request.
type wireRequest struct {
	method, path, key, ifMatch, contentType, body string
}

// wireServer answers each request with the next of answers (status,
// headers, body) and records what it got; it stands for the API's PATCH in
// tests of the client's side of the wire.
func wireServer(t *testing.T, answers ...func(w http.ResponseWriter)) (*httptest.Server, func() []wireRequest) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []wireRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, wireRequest{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), r.Header.Get("If-Match"), r.Header.Get("Content-Type"), string(b)})
		i := len(got) - 1
		mu.Unlock()
		if i >= len(answers) {
			http.Error(w, "unexpected request", http.StatusTeapot)
			return
		}
		answers[i](w)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []wireRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]wireRequest(nil), got...)
	}
}

func problemAnswer(status int, code, retry, extra string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/problem+json")
		if retry == contract.RetrySameKey {
			w.Header().Set("Retry-After", "0")
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"type":"urn:quill:problem:%s","title":"x","status":%d,"detail":"d","code":"%s","retry":"%s"%s}`, code, status, code, retry, extra)
	}
}

func noteAnswer(version int, etag bool) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		if etag {
			w.Header().Set("ETag", fmt.Sprintf(`"%d"`, version))
		}
		fmt.Fprintf(w, `{"id":%q,"title":"new","body":"b","created_at":"2026-01-01T00:00:00Z","attachment":null,"version":%d,"updated_at":"2026-01-02T00:00:00Z"}`,
			someID, version)
	}
}

// The client's side of PATCH: If-Match "N" and the key on every attempt,
// only the fields given in the body; 409 and 503 retried under the same
// key, the ETag's version read; 412 (with current_version), 404, 422 and
// 428 final, sent once.
func TestUpdateOnTheWire(t *testing.T) {
	t.Parallel()
	cfg := func(url string) client.Config {
		return client.Config{BaseURL: url, Token: "t", BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
	}
	t.Run("retried under the same key", func(t *testing.T) {
		t.Parallel()
		srv, got := wireServer(t,
			problemAnswer(409, contract.CodeInProgress, contract.RetrySameKey, ""),
			problemAnswer(503, contract.CodeUnavailable, contract.RetrySameKey, ""),
			noteAnswer(4, true))
		c, err := client.New(cfg(srv.URL))
		require.NoError(t, err)
		res, err := c.UpdateNote(t.Context(), someID, 3, client.NoteUpdate{Title: ptr("new")}, "")
		require.NoError(t, err)
		require.Equal(t, 3, res.Attempts)
		require.Equal(t, 4, res.Version)
		require.Equal(t, 4, res.Note.Version)
		require.Equal(t, time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), res.Note.UpdatedAt)
		reqs := got()
		require.Len(t, reqs, 3)
		for _, r := range reqs {
			require.Equal(t, wireRequest{http.MethodPatch, "/v1/notes/" + someID, res.Key, `"3"`, "application/json", `{"title":"new"}`}, r)
		}
	})
	t.Run("no ETag: the note's version", func(t *testing.T) {
		t.Parallel()
		srv, _ := wireServer(t, noteAnswer(9, false))
		c, err := client.New(cfg(srv.URL))
		require.NoError(t, err)
		res, err := c.UpdateNote(t.Context(), someID, 8, client.NoteUpdate{Body: ptr("")}, "k-noetag")
		require.NoError(t, err)
		require.Equal(t, "k-noetag", res.Key)
		require.Equal(t, 9, res.Version)
	})
	for _, tc := range []struct {
		status      int
		code, retry string
		extra       string
	}{
		{412, contract.CodePreconditionFailed, contract.RetryNo, `,"current_version":5`},
		{404, contract.CodeNotFound, contract.RetryNo, ""},
		{422, contract.CodeKeyReused, contract.RetryNo, `,"fields":["if_match"]`},
		{428, contract.CodePreconditionRequired, contract.RetryAfterFixing, ""},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			srv, got := wireServer(t, problemAnswer(tc.status, tc.code, tc.retry, tc.extra))
			c, err := client.New(cfg(srv.URL))
			require.NoError(t, err)
			_, err = c.UpdateNote(t.Context(), someID, 4, client.NoteUpdate{Title: ptr("new")}, "k-final")
			var r *client.RefusedError
			require.ErrorAs(t, err, &r)
			require.Equal(t, "k-final", r.Key)
			require.Equal(t, tc.status, r.Problem.Status)
			require.Equal(t, tc.code, r.Problem.Code)
			require.Len(t, got(), 1, "final: sent once")
			if tc.status == 412 {
				require.Equal(t, 5, r.Problem.CurrentVersion)
				var p *client.Problem
				require.ErrorAs(t, err, &p)
				require.Equal(t, 5, p.CurrentVersion)
				require.Contains(t, err.Error(), "current version: 5")
			}
		})
	}
	t.Run("delete with If-Match", func(t *testing.T) {
		t.Parallel()
		srv, got := wireServer(t, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("ETag", `"3"`)
			fmt.Fprintf(w, `{"id":%q,"deleted_at":"2026-01-03T00:00:00Z"}`, someID)
		}, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"deleted_at":"2026-01-03T00:00:00Z"}`, someID)
		})
		c, err := client.New(cfg(srv.URL))
		require.NoError(t, err)
		res, err := c.DeleteNoteIfVersion(t.Context(), someID, 2)
		require.NoError(t, err)
		require.Equal(t, 3, res.Version, "the version the delete made")
		_, err = c.DeleteNote(t.Context(), someID)
		require.NoError(t, err)
		reqs := got()
		require.Equal(t, `"2"`, reqs[0].ifMatch)
		require.Empty(t, reqs[0].body)
		require.Empty(t, reqs[1].ifMatch, "DeleteNote sends no If-Match")
	})
}

// Against the real API: an update under If-Match makes the next version; a
// stale version is a final 412 naming the current one; the same key again,
// after the note changed, replays the recorded 200; the same key with other
// parameters is 422; an update that changes nothing makes no version.
func TestUpdateNoteAgainstTheServer(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	var patches atomic.Int64
	api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPatch {
				patches.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	})
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, BaseDelay: time.Millisecond})
	require.NoError(t, err)
	ctx := t.Context()
	created, err := c.CreateNote(ctx, client.NewNote{Title: "draft", Body: "one"})
	require.NoError(t, err)
	require.Equal(t, 1, created.Note.Version)
	require.Equal(t, 1, created.Version, "the 201's ETag")
	require.Equal(t, created.Note.CreatedAt, created.Note.UpdatedAt)
	id := created.Note.ID

	up, err := c.UpdateNote(ctx, id, 1, client.NoteUpdate{Title: ptr("final")}, "upd-1")
	require.NoError(t, err)
	require.False(t, up.Replayed)
	require.Equal(t, 2, up.Version)
	require.Equal(t, 2, up.Note.Version)
	require.Equal(t, "final", up.Note.Title)
	require.Equal(t, "one", up.Note.Body, "a field not given is kept")
	require.False(t, up.Note.UpdatedAt.Before(up.Note.CreatedAt))
	n, err := c.GetNote(ctx, id)
	require.NoError(t, err)
	require.Equal(t, up.Note, *n)

	// Someone else's edit from version 1 is refused, once.
	before := patches.Load()
	_, err = c.UpdateNote(ctx, id, 1, client.NoteUpdate{Body: ptr("theirs")}, "upd-stale")
	var r *client.RefusedError
	require.ErrorAs(t, err, &r)
	require.Equal(t, http.StatusPreconditionFailed, r.Problem.Status)
	require.Equal(t, contract.CodePreconditionFailed, r.Problem.Code)
	require.Equal(t, contract.RetryNo, r.Problem.Retry)
	require.Equal(t, 2, r.Problem.CurrentVersion)
	require.Equal(t, before+1, patches.Load(), "a 412 is final: sent once")

	// The note moves on; the first update's key replays its recorded 200.
	_, err = c.UpdateNote(ctx, id, 2, client.NoteUpdate{Body: ptr("two")}, "upd-2")
	require.NoError(t, err)
	again, err := c.UpdateNote(ctx, id, 1, client.NoteUpdate{Title: ptr("final")}, "upd-1")
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, up.Note, again.Note, "the recorded answer, not the note as it is now")
	require.Equal(t, 2, again.Version)

	// The key with other parameters is 422 naming them.
	_, err = c.UpdateNote(ctx, id, 2, client.NoteUpdate{Title: ptr("final")}, "upd-1")
	require.ErrorAs(t, err, &r)
	require.Equal(t, contract.CodeKeyReused, r.Problem.Code)
	require.Equal(t, []string{"if_match"}, r.Problem.Fields)

	// Nothing to change: recorded, no new version.
	same, err := c.UpdateNote(ctx, id, 3, client.NoteUpdate{Body: ptr("two")}, "")
	require.NoError(t, err)
	require.Equal(t, 3, same.Note.Version)

	// No such note: a final 404.
	_, err = c.UpdateNote(ctx, "0193aaaa-0000-7000-8000-00000000dead", 1, client.NoteUpdate{Title: ptr("x")}, "")
	require.ErrorAs(t, err, &r)
	require.Equal(t, contract.CodeNotFound, r.Problem.Code)

	// A delete under a stale If-Match is 412 too; under the current one
	// it deletes, its ETag the version it made.
	_, err = c.DeleteNoteIfVersion(ctx, id, 2)
	require.ErrorAs(t, err, &r)
	require.Equal(t, 3, r.Problem.CurrentVersion)
	del, err := c.DeleteNoteIfVersion(ctx, id, 3)
	require.NoError(t, err)
	require.Equal(t, id, del.Deletion.ID)
	require.Equal(t, 4, del.Version)
}

// A lost answer to an update is retried under the same key and If-Match:
// the replay of the first delivery, one version made.
func TestUpdateDroppedResponseIsReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{Eligible: writesOnly})
	c := b.client(t, client.Config{})
	created, err := c.CreateNote(t.Context(), client.NewNote{Title: "drop my update"})
	require.NoError(t, err)
	b.proxy.DropNext(1)
	up, err := c.UpdateNote(t.Context(), created.Note.ID, 1, client.NoteUpdate{Body: ptr("once")}, "")
	require.NoError(t, err)
	require.True(t, up.Replayed)
	require.Equal(t, 2, up.Note.Version)
	n, err := c.GetNote(t.Context(), created.Note.ID)
	require.NoError(t, err)
	require.Equal(t, 2, n.Version, "executed once")
}

// An update whose answers are all lost stays unsettled in the journal, and
// Resume finishes it under its key with its parameters.
func TestUpdateResumesAfterACrash(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{}) // lookups are lost too, once dropping
	dir := t.TempDir()
	j, err := client.OpenFileJournal(dir)
	require.NoError(t, err)
	c1 := b.client(t, client.Config{Journal: j, Attempts: 1, Deadline: 2 * time.Second})
	created, err := c1.CreateNote(t.Context(), client.NewNote{Title: "resume my update"})
	require.NoError(t, err)
	require.NoError(t, b.proxy.SetDropProbability(1))
	_, err = c1.UpdateNote(t.Context(), created.Note.ID, 1, client.NoteUpdate{Title: ptr("resumed")}, "upd-crash")
	require.ErrorIs(t, err, client.ErrOutcomeUnknown)

	require.NoError(t, b.proxy.SetDropProbability(0))
	c2 := b.client(t, client.Config{Journal: j})
	res, err := c2.Resume(t.Context())
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NoError(t, res[0].Err)
	require.NotNil(t, res[0].Updated)
	require.Equal(t, "upd-crash", res[0].Updated.Key)
	require.True(t, res[0].Updated.Replayed)
	require.Equal(t, "resumed", res[0].Updated.Note.Title)
	require.Equal(t, 2, res[0].Updated.Note.Version)
	e, err := j.Get(t.Context(), "upd-crash")
	require.NoError(t, err)
	require.NotNil(t, e.Settled)
	var settled client.Note
	require.NoError(t, json.Unmarshal(e.Settled.Body, &settled))
	require.Equal(t, 2, settled.Version)
}
