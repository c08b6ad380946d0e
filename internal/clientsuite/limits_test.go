package clientsuite_test

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
)

// Short horizons of the servers these tests run: QUILL_IDEMPOTENCY_RETENTION
// 1h, QUILL_KEY_RETENTION 2h.
const (
	shortResponseRetention = time.Hour
	shortKeyRetention      = 2 * time.Hour
)

// horizonAPI is a real API (real PostgreSQL) run with the short horizons,
// counting the requests it gets by kind, with a switch that makes GET
// /v1/limits answer as an older server (404) or an unavailable one (503).
type horizonAPI struct {
	*apitest.API
	limitsReads atomic.Int64
	writes      atomic.Int64
	// limitsStatus, when not 0, answers GET /v1/limits with it.
	limitsStatus atomic.Int64
}

func startHorizonAPI(t *testing.T) *horizonAPI {
	t.Helper()
	a := &horizonAPI{API: apitest.StartWith(t, notes.Config{ResponseRetention: shortResponseRetention, KeyRetention: shortKeyRetention, Wait: 2 * time.Second})}
	a.Wrap(func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/limits" {
				a.limitsReads.Add(1)
				if st := int(a.limitsStatus.Load()); st != 0 {
					w.Header().Set("Content-Type", "application/problem+json")
					w.WriteHeader(st)
					fmt.Fprintf(w, `{"type":"about:blank","title":"x","status":%d,"detail":"x","code":"%s","retry":"%s"}`,
						st, map[int]string{404: "not_found", 503: "unavailable"}[st], map[int]string{404: "no", 503: "same_key"}[st])
					return
				}
			}
			if r.Method != http.MethodGet {
				a.writes.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	})
	return a
}

func (a *horizonAPI) client(t *testing.T, j client.Journal, keyRetention time.Duration) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{BaseURL: a.URL, Token: a.Token, Journal: j, KeyRetention: keyRetention,
		Attempts: 2, Deadline: 5 * time.Second, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond})
	require.NoError(t, err)
	return c
}

// journalled records an unsettled create-note first sent age ago.
func journalled(t *testing.T, j client.Journal, key, title string, age time.Duration) {
	t.Helper()
	_, err := j.Begin(t.Context(), client.JournalEntry{Key: key, Action: contract.ActionCreateNote,
		Params: []byte(fmt.Sprintf(`{"title":%q}`, title)), CreatedAt: time.Now().Add(-age).UTC()})
	require.NoError(t, err)
}

// A server run with QUILL_KEY_RETENTION=2h forgets a key after two hours. A
// journalled create first sent three hours ago is not resent — it would
// make a second note — and the refusal names the key and the server's
// retention; one first sent 90 minutes ago is resent under its key.
func TestResumeRefusesAKeyOlderThanTheServersKeyRetention(t *testing.T) {
	t.Parallel()
	api := startHorizonAPI(t)
	j, err := client.OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	journalled(t, j, "late-1", "resumed too late", 3*time.Hour)
	journalled(t, j, "in-time-1", "resumed in time", 90*time.Minute)
	c := api.client(t, j, 0)

	res, err := c.Resume(t.Context())
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.Equal(t, "late-1", res[0].Entry.Key)
	require.ErrorIs(t, res[0].Err, client.ErrKeyTooOld)
	require.Contains(t, res[0].Err.Error(), `"late-1"`)
	require.Contains(t, res[0].Err.Error(), "key retention is 2h")
	require.Zero(t, api.Notes(t, "resumed too late"), "no note: the key was not resent")
	require.NoError(t, res[1].Err)
	require.Equal(t, "in-time-1", res[1].Created.Key)
	require.Equal(t, 1, api.Notes(t, "resumed in time"))
	require.EqualValues(t, 1, api.writes.Load(), "only the key within the retention was sent")

	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Len(t, un, 1, "the refused one stays unsettled, for ops get or prune")
	require.Equal(t, "late-1", un[0].Key)

	// The same with a write of a key the caller keeps itself.
	_, err = c.CreateNote(t.Context(), client.NewNote{Title: "kept by the caller"}, client.WithKey("late-2"),
		client.WithFirstSent(time.Now().Add(-3*time.Hour)))
	require.ErrorIs(t, err, client.ErrKeyTooOld)
	require.Contains(t, err.Error(), `"late-2"`)
	require.Zero(t, api.Notes(t, "kept by the caller"))
	require.EqualValues(t, 1, api.limitsReads.Load(), "the limits are read once per client")
}

// Limits answers the server's settings, read once and cached.
func TestLimitsAreTheServersAndReadOnce(t *testing.T) {
	t.Parallel()
	api := startHorizonAPI(t)
	c := api.client(t, nil, 0)
	for range 3 {
		l, err := c.Limits(t.Context())
		require.NoError(t, err)
		require.Equal(t, client.Limits{ResponseRetention: time.Hour, KeyRetention: 2 * time.Hour,
			MaxBodyBytes: httpapi.DefaultMaxBodyBytes, MaxAttachmentBytes: httpapi.DefaultMaxAttachmentBytes,
			TenantConcurrency: httpapi.DefaultTenantConcurrency}, l)
	}
	require.EqualValues(t, 1, api.limitsReads.Load())

	// Concurrent first needs share one request.
	c = api.client(t, nil, 0)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			l, err := c.Limits(t.Context())
			assert.NoError(t, err)
			assert.Equal(t, 2*time.Hour, l.KeyRetention)
		})
	}
	wg.Wait()
	require.EqualValues(t, 2, api.limitsReads.Load())

	// A bad token: the server's 401, not a guess.
	bad, err := client.New(client.Config{BaseURL: api.URL, Token: "qt_00000000_nope", Attempts: 1})
	require.NoError(t, err)
	_, err = bad.Limits(t.Context())
	require.ErrorIs(t, err, client.ErrLimitsUnavailable)
	var p *client.Problem
	require.ErrorAs(t, err, &p)
	require.Equal(t, "unauthenticated", p.Code)
}

// Config.KeyRetention, when set, wins over the server's, and the limits
// are not read for it.
func TestExplicitKeyRetentionWins(t *testing.T) {
	t.Parallel()
	api := startHorizonAPI(t)
	c := api.client(t, nil, 30*time.Minute)
	_, err := c.CreateNote(t.Context(), client.NewNote{Title: "explicit"}, client.WithKey("explicit-1"),
		client.WithFirstSent(time.Now().Add(-time.Hour)))
	require.ErrorIs(t, err, client.ErrKeyTooOld, "within the server's 2h, past the caller's 30m")
	require.Contains(t, err.Error(), "key retention is 30m")
	require.Zero(t, api.limitsReads.Load())
	require.Zero(t, api.writes.Load())
}

// A write of a key never sent before needs no retention: it neither reads
// the limits nor waits for them, however they would answer.
func TestAFreshWriteNeverWaitsForTheLimits(t *testing.T) {
	t.Parallel()
	api := startHorizonAPI(t)
	api.limitsStatus.Store(http.StatusServiceUnavailable)
	j, err := client.OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	for _, jr := range []client.Journal{nil, j} {
		c := api.client(t, jr, 0)
		got, err := c.CreateNote(t.Context(), client.NewNote{Title: "fresh"})
		require.NoError(t, err)
		require.False(t, got.Replayed)
	}
	require.Equal(t, 2, api.Notes(t, "fresh"))
	require.Zero(t, api.limitsReads.Load())
}

// While the server's key retention cannot be read, a key first sent within
// FallbackKeyRetention is resent and an older one is refused (it stays
// unsettled); an older server's 404 is remembered, an unavailable server's
// 503 is not, so a later resume reads the limits and resends the key.
func TestUnknownKeyRetentionFallsBackToAnHour(t *testing.T) {
	t.Parallel()
	t.Run("an older server", func(t *testing.T) {
		t.Parallel()
		api := startHorizonAPI(t)
		api.limitsStatus.Store(http.StatusNotFound)
		j, err := client.OpenFileJournal(t.TempDir())
		require.NoError(t, err)
		journalled(t, j, "old-srv-young", "young key", 10*time.Minute)
		journalled(t, j, "old-srv-old", "old key", 90*time.Minute)
		c := api.client(t, j, 0)
		res, err := c.Resume(t.Context())
		require.NoError(t, err)
		require.Len(t, res, 2)
		require.ErrorIs(t, res[0].Err, client.ErrKeyTooOld)
		require.ErrorIs(t, res[0].Err, client.ErrLimitsUnavailable)
		require.Contains(t, res[0].Err.Error(), `"old-srv-old"`)
		require.Contains(t, res[0].Err.Error(), "unknown")
		require.NoError(t, res[1].Err)
		require.Zero(t, api.Notes(t, "old key"))
		require.Equal(t, 1, api.Notes(t, "young key"))
		require.EqualValues(t, 1, api.limitsReads.Load(), "a 404 is final: asked once")
	})
	t.Run("an unavailable server", func(t *testing.T) {
		t.Parallel()
		api := startHorizonAPI(t)
		api.limitsStatus.Store(http.StatusServiceUnavailable)
		j, err := client.OpenFileJournal(t.TempDir())
		require.NoError(t, err)
		journalled(t, j, "down-old", "waits for the limits", 90*time.Minute)
		c := api.client(t, j, 0)
		res, err := c.Resume(t.Context())
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.ErrorIs(t, res[0].Err, client.ErrKeyTooOld)
		require.True(t, errors.Is(res[0].Err, client.ErrLimitsUnavailable))
		require.Zero(t, api.Notes(t, "waits for the limits"))

		api.limitsStatus.Store(0)
		res, err = c.Resume(t.Context())
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.NoError(t, res[0].Err, "90 minutes is within the server's 2h")
		require.Equal(t, 1, api.Notes(t, "waits for the limits"))
	})
}
