package clientsuite_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// testBundle is a real API (real PostgreSQL) behind a response-dropping
// proxy, and a client of the proxy.
type testBundle struct {
	api   *apitest.API
	proxy *faultproxy.Proxy
	front string
}

func setup(t *testing.T, pcfg faultproxy.Config) *testBundle {
	t.Helper()
	api := apitest.Start(t)
	p, front := api.Proxy(t, pcfg)
	return &testBundle{api: api, proxy: p, front: front}
}

func (b *testBundle) client(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	if cfg.BaseURL == "" {
		cfg.BaseURL = b.front
	}
	cfg.Token = b.api.Token
	if cfg.BaseDelay == 0 {
		cfg.BaseDelay = 5 * time.Millisecond
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = 50 * time.Millisecond
	}
	c, err := client.New(cfg)
	require.NoError(t, err)
	return c
}

func writesOnly(r *http.Request) bool { return r.Method != http.MethodGet }

func TestDroppedResponseIsReplayedAndOneNoteExists(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{Eligible: writesOnly})
	c := b.client(t, client.Config{})
	b.proxy.DropNext(1)
	got, err := c.CreateNote(t.Context(), client.NewNote{Title: "dropped once", Body: "b"})
	require.NoError(t, err)
	require.True(t, got.Replayed, "the answer is the replay of the first delivery")
	require.NotEmpty(t, got.Key)
	require.Equal(t, "dropped once", got.Note.Title)
	require.EqualValues(t, 1, b.proxy.Stats().Dropped)
	require.Equal(t, 1, b.api.Notes(t, "dropped once"))

	// Deletes too.
	b.proxy.DropNext(1)
	del, err := c.DeleteNote(t.Context(), got.Note.ID)
	require.NoError(t, err)
	require.True(t, del.Replayed)
	require.Equal(t, got.Note.ID, del.Deletion.ID)
}

func TestAttemptsRunOutThenTheLookupFindsTheOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{Eligible: writesOnly, DropProbability: 1})
	c := b.client(t, client.Config{Attempts: 2})
	got, err := c.CreateNote(t.Context(), client.NewNote{Title: "looked up"}, client.WithKey("lookup-1"))
	require.NoError(t, err)
	require.Equal(t, "lookup-1", got.Key)
	require.True(t, got.Replayed)
	require.Equal(t, "looked up", got.Note.Title)
	require.Equal(t, 1, b.api.Notes(t, "looked up"))
}

func TestOutcomeUnknownCarriesTheKeyAndTheSameKeyFinishesIt(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{DropProbability: 1}) // lookups are lost too
	c := b.client(t, client.Config{Attempts: 2, Deadline: 5 * time.Second})
	_, err := c.CreateNote(t.Context(), client.NewNote{Title: "unknown"})
	var u *client.UnknownOutcomeError
	require.ErrorAs(t, err, &u)
	require.ErrorIs(t, err, client.ErrOutcomeUnknown)
	require.Contains(t, err.Error(), "outcome unknown")
	require.NotEmpty(t, u.Key)
	require.Equal(t, "failed", u.Lookup)
	require.Equal(t, 1, b.api.Notes(t, "unknown"), "it did execute")

	require.NoError(t, b.proxy.SetDropProbability(0))
	got, err := c.CreateNote(t.Context(), client.NewNote{Title: "unknown"}, client.WithKey(u.Key))
	require.NoError(t, err)
	require.True(t, got.Replayed)
	require.Equal(t, 1, b.api.Notes(t, "unknown"))
	op, err := c.GetOperation(t.Context(), u.Key)
	require.NoError(t, err)
	require.Equal(t, contract.OperationCompleted, op.State)
	require.Equal(t, contract.ActionCreateNote, op.Action)
}

func TestHungServerHonoursTheDeadline(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	api.Wrap(func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		})
	})
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, Deadline: 2 * time.Second,
		AttemptTimeout: 300 * time.Millisecond, Attempts: 100, BaseDelay: 10 * time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	_, err = c.CreateNote(t.Context(), client.NewNote{Title: "hung"}, client.WithKey("hung-1"))
	elapsed := time.Since(start)
	var u *client.UnknownOutcomeError
	require.ErrorAs(t, err, &u)
	require.Equal(t, "hung-1", u.Key)
	require.Contains(t, err.Error(), "hung-1")
	require.Less(t, elapsed, 2*time.Second+500*time.Millisecond, "the deadline covers attempts and lookup")
	require.Greater(t, u.Attempts, 1)
}

func TestRetryAfterIsHonouredAnd503Retried(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	var calls atomic.Int64
	api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && calls.Add(1) == 1 {
				w.Header().Set("Content-Type", "application/problem+json")
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprint(w, `{"type":"urn:quill:problem:unavailable","title":"Service Unavailable","status":503,"detail":"x","code":"unavailable","retry":"same_key"}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, BaseDelay: time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	got, err := c.CreateNote(t.Context(), client.NewNote{Title: "after 503"})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), time.Second, "Retry-After: 1 was waited")
	require.Equal(t, 2, got.Attempts)
	require.Equal(t, 1, api.Notes(t, "after 503"))
}

func Test422IsNeverRetried(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	var posts atomic.Int64
	api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				posts.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	})
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token})
	require.NoError(t, err)
	_, err = c.CreateNote(t.Context(), client.NewNote{Title: "first"}, client.WithKey("k-422"))
	require.NoError(t, err)
	_, err = c.CreateNote(t.Context(), client.NewNote{Title: "second"}, client.WithKey("k-422"))
	var r *client.RefusedError
	require.ErrorAs(t, err, &r)
	require.Equal(t, "k-422", r.Key)
	require.Equal(t, 422, r.Problem.Status)
	require.Equal(t, "idempotency_key_reused", r.Problem.Code)
	require.Equal(t, []string{"title"}, r.Problem.Fields)
	require.EqualValues(t, 2, posts.Load(), "one request per call: the 422 was not retried")

	// A validation failure is final too.
	_, err = c.CreateNote(t.Context(), client.NewNote{Title: ""})
	require.ErrorAs(t, err, &r)
	require.Equal(t, "validation_failed", r.Problem.Code)
	require.EqualValues(t, 3, posts.Load())
}

func TestParallelClientsThroughAFlakyProxyMakeNoDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{DropProbability: 0.3, Seed: 42})
	c := b.client(t, client.Config{Attempts: 10, Deadline: 60 * time.Second})
	const n = 100
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			_, errs[i] = c.CreateNote(t.Context(), client.NewNote{Title: fmt.Sprintf("parallel %03d", i)})
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "client %d", i)
	}
	var dups int
	err := b.api.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM (SELECT title FROM notes WHERE tenant = $1 GROUP BY title HAVING count(*) > 1) d`,
		b.api.Tenant).Scan(&dups)
	require.NoError(t, err)
	require.Zero(t, dups)
	require.Equal(t, n, b.api.Notes(t, ""))
	require.Positive(t, b.proxy.Stats().Dropped)
	t.Logf("proxy: %+v", b.proxy.Stats())
}

func TestReads(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{Eligible: func(r *http.Request) bool { return r.Method == http.MethodGet }})
	c := b.client(t, client.Config{})
	created, err := c.CreateNote(t.Context(), client.NewNote{Title: "read me", Body: "x",
		Attachment: &client.NewAttachment{Filename: "a.txt", ContentType: "text/plain", Data: []byte("hello\n")}})
	require.NoError(t, err)
	require.NotNil(t, created.Note.Attachment)
	require.EqualValues(t, 6, created.Note.Attachment.Size)

	b.proxy.DropNext(1) // reads are retried too
	n, err := c.GetNote(t.Context(), created.Note.ID)
	require.NoError(t, err)
	require.Equal(t, created.Note, *n)

	l, err := c.ListNotes(t.Context(), client.ListOptions{Limit: 10})
	require.NoError(t, err)
	require.Len(t, l.Items, 1)

	_, err = c.GetNote(t.Context(), "0193aaaa-0000-7000-8000-000000000000")
	var p *client.Problem
	require.ErrorAs(t, err, &p)
	require.Equal(t, "not_found", p.Code)

	_, err = c.GetOperation(t.Context(), "never-sent")
	require.ErrorAs(t, err, &p)
	require.Equal(t, "operation_not_found", p.Code)
}

func TestJournalledOperationResumesAfterACrash(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{DropProbability: 1})
	dir := t.TempDir()
	j, err := client.OpenFileJournal(dir)
	require.NoError(t, err)

	// First process: journals, sends (the API commits), never hears back,
	// and "dies" with the operation unsettled.
	c1 := b.client(t, client.Config{Journal: j, Attempts: 1, Deadline: 2 * time.Second})
	_, err = c1.CreateNote(t.Context(), client.NewNote{Title: "crash after commit"}, client.WithKey("crash-1"))
	require.ErrorIs(t, err, client.ErrOutcomeUnknown)

	// And one that died after journalling, before sending.
	_, err = j.Begin(t.Context(), client.JournalEntry{Key: "crash-2", Action: contract.ActionCreateNote,
		Params: []byte(`{"title":"crash before send"}`), CreatedAt: time.Now()})
	require.NoError(t, err)

	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Len(t, un, 2)

	// Second process, the network healthy again.
	require.NoError(t, b.proxy.SetDropProbability(0))
	j2, err := client.OpenFileJournal(dir)
	require.NoError(t, err)
	c2 := b.client(t, client.Config{Journal: j2})
	res, err := c2.Resume(t.Context())
	require.NoError(t, err)
	require.Len(t, res, 2)
	for _, r := range res {
		require.NoError(t, r.Err)
		require.NotNil(t, r.Created)
	}
	require.Equal(t, "crash-1", res[0].Entry.Key)
	require.True(t, res[0].Created.Replayed, "resumed under the original key: a replay")
	require.Equal(t, 1, b.api.Notes(t, "crash after commit"))
	require.Equal(t, 1, b.api.Notes(t, "crash before send"))
	un, err = j2.Unsettled(t.Context())
	require.NoError(t, err)
	require.Empty(t, un)

	// Nothing left: a second resume does nothing.
	res, err = c2.Resume(t.Context())
	require.NoError(t, err)
	require.Empty(t, res)
}

func TestKeyOlderThanRetentionIsNeverResent(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	var requests atomic.Int64
	api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/limits" { // the server's key retention is read
				requests.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	})
	j, err := client.OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	_, err = j.Begin(t.Context(), client.JournalEntry{Key: "old-1", Action: contract.ActionCreateNote,
		Params: []byte(`{"title":"old"}`), CreatedAt: time.Now().Add(-721 * time.Hour)})
	require.NoError(t, err)
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, Journal: j})
	require.NoError(t, err)
	res, err := c.Resume(t.Context())
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.True(t, errors.Is(res[0].Err, client.ErrKeyTooOld), "%v", res[0].Err)

	_, err = c.CreateNote(t.Context(), client.NewNote{Title: "old"}, client.WithKey("old-2"),
		client.WithFirstSent(time.Now().Add(-800*time.Hour)))
	require.ErrorIs(t, err, client.ErrKeyTooOld)
	require.Zero(t, requests.Load())

	// A shorter server retention is a client option.
	c2, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, KeyRetention: time.Hour})
	require.NoError(t, err)
	_, err = c2.CreateNote(t.Context(), client.NewNote{Title: "old"}, client.WithKey("old-3"),
		client.WithFirstSent(time.Now().Add(-2*time.Hour)))
	require.ErrorIs(t, err, client.ErrKeyTooOld)
	require.Zero(t, requests.Load())
}
