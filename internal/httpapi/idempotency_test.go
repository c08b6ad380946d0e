package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/testkit"
)

// The article's list: each failure the caller cannot see, as its own test.

func TestFailureBeforeCommitRollsBackEverything(t *testing.T) {
	t.Parallel()
	b := setup(t, standard)
	// The record's insert raises only when the note row exists inside
	// the transaction: the failure comes after the effect, before the
	// COMMIT, on the path production runs.
	b.fault("fail")
	r := b.create(b.tokenA, "op-fail", note("Rollback"))
	require.Equal(t, http.StatusInternalServerError, r.status, "%s", r.body)
	require.Equal(t, "same_key", r.json(t)["retry"])
	require.Zero(t, b.notes(b.tenantA), "the note must roll back with the failed operation")
	require.Zero(t, b.count(`SELECT count(*) FROM operations`))
	require.Zero(t, b.count(`SELECT count(*) FROM outbox_events`))
	require.Zero(t, b.count(`SELECT count(*) FROM attachments`))
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "op-fail").status)

	b.clearFaults()
	r = b.create(b.tokenA, "op-fail", note("Rollback"))
	require.Equal(t, http.StatusCreated, r.status)
	require.Empty(t, r.header.Get("Idempotent-Replayed"), "the retry executes: nothing was recorded before")
	require.Equal(t, 1, b.notes(b.tenantA))
}

// dropAfterCommit runs the real handler to completion, then closes the
// client's connection without sending the response: the commit happened,
// the caller cannot know.
func dropAfterCommit(times int) func(http.Handler) http.Handler {
	var mu sync.Mutex
	left := times
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			drop := left > 0
			if drop {
				left--
			}
			mu.Unlock()
			if !drop {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		})
	}
}

func TestLostPostCommitResponseIsReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wrap := dropAfterCommit(1)
	b.wrap.Store(&wrap)
	body := map[string]any{"title": "Example note", "attachment": map[string]any{"filename": "a.txt", "content_type": "text/plain", "data": b64("hello\n")}}
	_, err := b.do(t.Context(), req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "operation-1", body: body})
	require.Error(t, err, "the response must be lost on the way back")
	require.Equal(t, 1, b.notes(b.tenantA), "the note was committed although the caller saw an error")

	r := b.create(b.tokenA, "operation-1", body)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.notes(b.tenantA), "the retry must not create a second note")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox_events WHERE type = 'note.created'`))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM attachments`))
}

func TestClientDisconnectDoesNotAbortCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, standard)
	ctx, cancel := context.WithCancel(t.Context())
	entered, release := b.holdWrites("")
	errc := make(chan error, 1)
	go func() {
		_, err := b.do(ctx, req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "gone", body: note("t")})
		errc <- err
	}()
	<-entered
	cancel() // the client goes away mid-transaction
	require.ErrorIs(t, <-errc, context.Canceled)
	release()
	testkit.WaitFor(t, 5*time.Second, func() bool { return b.count(`SELECT count(*) FROM operations`) == 1 }, "the detached transaction commits")
	b.clearFaults()
	require.Equal(t, 1, b.notes(b.tenantA))
	r := b.create(b.tokenA, "gone", note("t"))
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
}

func TestIdenticalReplayReturnsRecordedResponse(t *testing.T) {
	t.Parallel()
	bothCaches(t, testIdenticalReplay)
}

func testIdenticalReplay(t *testing.T, b *testBundle) {
	first := b.create(b.tokenA, "op-1", note("Example note"))
	require.Equal(t, http.StatusCreated, first.status)
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	id := first.json(t)["id"].(string)
	require.Equal(t, "/v1/notes/"+id, first.header.Get("Location"))

	for range 3 {
		again := b.create(b.tokenA, `"op-1"`, note("Example note")) // the sf-string form names the same key
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
		require.Equal(t, string(first.body), string(again.body), "byte-for-byte equal body")
	}
	require.Equal(t, 1, b.notes(b.tenantA))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox_events`))
	require.Equal(t, 1.0, testkit.Gathered(t, b.reg, "quill_idempotency_requests_total", map[string]string{"action": "create-note", "outcome": "executed"}))
	require.Equal(t, 3.0, testkit.Gathered(t, b.reg, "quill_idempotency_requests_total", map[string]string{"action": "create-note", "outcome": "replayed"}))
	require.Equal(t, 1.0, testkit.Gathered(t, b.reg, "quill_business_effects_total", map[string]string{"action": "create-note"}))
	require.Equal(t, 4.0, testkit.Gathered(t, b.reg, "quill_http_requests_total", map[string]string{"route": "/v1/notes", "method": "POST", "code": "201"}))
}

func TestChangedParametersUnderSameKeyAreRefused(t *testing.T) {
	t.Parallel()
	bothCaches(t, testChangedParameters)
}

func testChangedParameters(t *testing.T, b *testBundle) {
	att := map[string]any{"filename": "a.txt", "content_type": "text/plain", "data": b64("one")}
	require.Equal(t, http.StatusCreated, b.create(b.tokenA, "op-1", map[string]any{"title": "Example note", "body": "x", "attachment": att}).status)

	cases := []struct {
		name   string
		body   map[string]any
		fields []any
	}{
		{"title", map[string]any{"title": "Changed title", "body": "x", "attachment": att}, []any{"title"}},
		{"body", map[string]any{"title": "Example note", "body": "y", "attachment": att}, []any{"body"}},
		{"body omitted", map[string]any{"title": "Example note", "attachment": att}, []any{"body"}},
		{"attachment bytes", map[string]any{"title": "Example note", "body": "x", "attachment": map[string]any{"filename": "a.txt", "content_type": "text/plain", "data": b64("two")}}, []any{"attachment"}},
		{"no attachment", map[string]any{"title": "Example note", "body": "x"}, []any{"attachment"}},
		{"two fields", map[string]any{"title": "T", "body": "z", "attachment": att}, []any{"body", "title"}},
	}
	for _, tc := range cases {
		r := b.create(b.tokenA, "op-1", tc.body)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, tc.name)
		p := r.json(t)
		require.Equal(t, "idempotency_key_reused", p["code"], tc.name)
		require.Equal(t, "no", p["retry"], tc.name)
		require.Equal(t, tc.fields, p["fields"], tc.name)
	}
	require.Equal(t, 1, b.notes(b.tenantA))
	var title string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT title FROM notes`).Scan(&title))
	require.Equal(t, "Example note", title, "the old response never stands for the new title")
}

func TestNewKeyWithIdenticalContentIsANewNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r1 := b.create(b.tokenA, "op-1", note("Example note"))
	r2 := b.create(b.tokenA, "op-2", note("Example note"))
	requireTwoNotesCreated(t, r1, r2)
	require.Equal(t, 2, b.notes(b.tenantA))
}

// requireTwoNotesCreated requires that both creates executed: each answered
// 201, the second is no replay of the first, and their notes differ.
func requireTwoNotesCreated(t *testing.T, first, second resp, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, http.StatusCreated, second.status)
	require.Empty(t, second.header.Get("Idempotent-Replayed"), msgAndArgs...)
	require.NotEqual(t, first.json(t)["id"], second.json(t)["id"])
}

func TestSameKeyInTwoTenantsIsTwoOperations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.create(b.tokenA, "operation-1", note("Example note"))
	rb := b.create(b.tokenB, "operation-1", note("Example note"))
	requireTwoNotesCreated(t, ra, rb, "tenant B must not get tenant A's outcome")
	require.Equal(t, 1, b.notes(b.tenantA))
	require.Equal(t, 1, b.notes(b.tenantB))
	// Different parameters under the same key in the other tenant are fine.
	rc := b.create(b.tokenB, "operation-2", note("Other"))
	require.Equal(t, http.StatusCreated, rc.status)
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "operation-2").status)
	// Each tenant sees only its own note.
	idA := ra.json(t)["id"].(string)
	require.Equal(t, http.StatusNotFound, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + idA, token: b.tokenB}).status)
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + idA, token: b.tokenA}).status)
}

func TestSameKeyForAnotherActionIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.create(b.tokenA, "op-1", note("Example note"))
	id := r.json(t)["id"].(string)
	d := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "op-1"})
	require.Equal(t, http.StatusUnprocessableEntity, d.status)
	require.Equal(t, []any{"action"}, d.json(t)["fields"])
	require.Equal(t, 1, b.count(`SELECT count(*) FROM notes WHERE deleted_at IS NULL`), "the delete must not run")

	// And the other way round: a delete's key cannot create.
	d = b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "del-1"})
	require.Equal(t, http.StatusOK, d.status)
	c := b.create(b.tokenA, "del-1", note("x"))
	require.Equal(t, http.StatusUnprocessableEntity, c.status)
	require.Equal(t, []any{"action"}, c.json(t)["fields"])
}

func TestValidationFailuresAreNotRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const key = "op-invalid"
	bad := []req{
		{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: key, body: `{"title":`, offContract: "invalid JSON"},                                                            // invalid_json
		{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: key, body: `{"title":"a","extra":1}`, offContract: "unknown member"},                                            // unknown member
		{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: key, body: `{"title":""}`, offContract: "empty title"},                                                          // validation_failed
		{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: key, body: `{"title":"a"}`, header: map[string]string{"Content-Type": "text/plain"}, offContract: "not JSON"},   // 415
		{method: http.MethodPost, path: "/v1/notes", token: "qt_00000000_" + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", key: key, body: `{"title":"a"}`, offContract: "unknown token"}, // 401
	}
	want := []int{400, 400, 400, 415, 401}
	for i, r := range bad {
		got := b.mustDo(r)
		require.Equal(t, want[i], got.status, "request %d: %s", i, got.body)
	}
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = 'a'
	}
	tooLarge := b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: key, body: `{"title":"` + string(big) + `"}`, offContract: "over the body limit"})
	require.Equal(t, http.StatusRequestEntityTooLarge, tooLarge.status)

	l := b.lookup(b.tokenA, key)
	require.Equal(t, http.StatusNotFound, l.status)
	require.Equal(t, "operation_not_found", l.json(t)["code"])
	require.Equal(t, "same_key", l.json(t)["retry"])
	require.Zero(t, b.count(`SELECT count(*) FROM operations`))

	r := b.create(b.tokenA, key, note("valid at last"))
	require.Equal(t, http.StatusCreated, r.status)
	require.Empty(t, r.header.Get("Idempotent-Replayed"), "the first valid request executes")
}

func TestConcurrentIdenticalRequestsExecuteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 50
	start := make(chan struct{})
	results := make([]resp, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := b.do(t.Context(), req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "burst", body: note("Example note")})
			require.NoError(t, err)
			results[i] = r
		})
	}
	close(start)
	wg.Wait()
	executed, replayed, inProgress := 0, 0, 0
	var body string
	for _, r := range results {
		switch {
		case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "":
			executed++
			body = string(r.body)
		case r.status == http.StatusCreated:
			replayed++
		case r.status == http.StatusConflict:
			inProgress++
			require.Equal(t, "1", r.header.Get("Retry-After"))
		default:
			t.Fatalf("unexpected answer %d: %s", r.status, r.body)
		}
	}
	require.Equal(t, 1, executed, "exactly one request executes")
	require.Equal(t, n, executed+replayed+inProgress)
	for _, r := range results {
		if r.status == http.StatusCreated {
			require.Equal(t, body, string(r.body))
		}
	}
	require.Equal(t, 1, b.notes(b.tenantA))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox_events`))
}

// Concurrent requests for one key wait without holding database connections:
// with a pool of 4 and 100 waiters, other tenants still get served.
func TestWaitingRequestsDoNotStarveOtherTenants(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxConns: 4, wait: 20 * time.Second})
	entered, release := b.holdWrites("")
	const waiters = 100
	var wg sync.WaitGroup
	results := make([]resp, waiters+1)
	for i := range waiters + 1 {
		wg.Go(func() {
			r, err := b.do(context.Background(), req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "held", body: note("held")})
			require.NoError(t, err)
			results[i] = r
		})
		if i == 0 {
			<-entered // the first holds the operation open
		}
	}
	testkit.WaitFor(t, 10*time.Second, func() bool { return b.inFlight.Load() == waiters+1 }, "all requests in flight")
	b.clearFaults()

	// Another tenant's creates, one after another, while the 100 wait.
	for i := range 10 {
		started := time.Now()
		r := b.create(b.tokenB, "other-"+uuid.NewString(), note("other"))
		require.Equal(t, http.StatusCreated, r.status, "create %d: %s", i, r.body)
		require.Less(t, time.Since(started), time.Second, "another tenant's create must not wait behind the held key")
	}
	require.Equal(t, int64(waiters+1), b.inFlight.Load(), "the waiters are still waiting")
	release()
	wg.Wait()
	executed := 0
	for _, r := range results {
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
		if r.header.Get("Idempotent-Replayed") == "" {
			executed++
		}
	}
	require.Equal(t, 1, executed)
	require.Equal(t, 1, b.notes(b.tenantA))
	require.Equal(t, 10, b.notes(b.tenantB))
}

func TestPreferWaitZeroAnswersInProgressAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxConns: 4, wait: 20 * time.Second})
	entered, release := b.holdWrites("")
	done := make(chan resp)
	go func() { done <- b.create(b.tokenA, "held", note("held")) }()
	<-entered
	b.clearFaults()
	r := b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "held", body: note("held"),
		header: map[string]string{"Prefer": "wait=0"}})
	require.Equal(t, http.StatusConflict, r.status)
	p := r.json(t)
	require.Equal(t, "operation_in_progress", p["code"])
	require.Equal(t, "same_key", p["retry"])
	require.Equal(t, "1", r.header.Get("Retry-After"))
	release()
	require.Equal(t, http.StatusCreated, (<-done).status)
	r = b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "held", body: note("held")})
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
}

// A write whose connection dies before COMMIT answers 503 "nothing
// committed" after re-checking, and the retry executes.
func TestConnectionLostBeforeCommitIsRechecked(t *testing.T) {
	t.Parallel()
	b := setup(t, standard)
	// The session ends itself inside the write's statement, before the
	// COMMIT it carries runs.
	b.fault("terminate")
	r := b.create(b.tokenA, "op-cut", note("cut"))
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	p := r.json(t)
	require.Equal(t, "unavailable", p["code"])
	require.Equal(t, "same_key", p["retry"])
	require.Contains(t, p["detail"], "nothing was committed")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	b.clearFaults()
	require.Zero(t, b.notes(b.tenantA))
	r = b.create(b.tokenA, "op-cut", note("cut"))
	require.Equal(t, http.StatusCreated, r.status)
	require.Empty(t, r.header.Get("Idempotent-Replayed"))
}

// The COMMIT reaches the server and commits, but its reply is lost on the
// way back: the API re-checks on a fresh connection and answers with the
// real outcome — the note it created — instead of an error.
func TestLostCommitReplyIsRecheckedAndAnsweredWithTheOutcome(t *testing.T) {
	t.Parallel()
	// The production path: claim, note, event, record and COMMIT in one
	// round trip, whose reply the proxy swallows.
	b := setup(t, setupOpts{maxConns: 4, wait: 2 * time.Second, proxy: true})
	b.proxy.LoseNextReply()
	r := b.create(b.tokenA, "op-lost-commit", note("committed in the dark"))
	require.Equal(t, 1, b.proxy.Cuts(), "the COMMIT reply must have been lost")
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Empty(t, r.header.Get("Idempotent-Replayed"), "this request executed it")
	require.Equal(t, 1, b.notes(b.tenantA))
	id := r.json(t)["id"].(string)
	require.Equal(t, "/v1/notes/"+id, r.header.Get("Location"))

	again := b.create(b.tokenA, "op-lost-commit", note("committed in the dark"))
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, string(r.body), string(again.body))
	require.Equal(t, 1, b.notes(b.tenantA))
	require.Equal(t, 1.0, testkit.Gathered(t, b.reg, "quill_business_effects_total", map[string]string{"action": "create-note"}))
}
