package console_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/console"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/outbox"
)

// harness is a real API (apitest) and a console over its database.
type harness struct {
	api     *apitest.API
	con     *console.Console
	srv     *httptest.Server
	opToken string
	now     atomic.Pointer[time.Time]
	logs    *strings.Builder
}

func start(t *testing.T) *harness { return startWith(t, options{}) }

// options vary the harness's console.
type options struct {
	// cfg is the console's Config; Now and ValidityTTL (10s) are set.
	cfg console.Config
	// tls serves the console with httptest.NewTLSServer.
	tls bool
	// pool is the console's pool (default: the API's).
	pool *pgxpool.Pool
}

func startWith(t *testing.T, o options) *harness {
	t.Helper()
	h := &harness{api: apitest.Start(t), logs: &strings.Builder{}}
	now := time.Now()
	h.now.Store(&now)
	h.con = h.newConsole(t, o)
	if o.tls {
		h.srv = httptest.NewTLSServer(h.con.Mount(http.NotFoundHandler()))
	} else {
		h.srv = httptest.NewServer(h.con.Mount(http.NotFoundHandler()))
	}
	t.Cleanup(h.srv.Close)
	var err error
	h.opToken, err = auth.CreateOperator(t.Context(), h.api.Pool, "alice", time.Now())
	require.NoError(t, err)
	return h
}

// newConsole returns a console over h's database, on h's clock, as
// another API process would run it.
func (h *harness) newConsole(t *testing.T, o options) *console.Console {
	t.Helper()
	cfg := o.cfg
	cfg.Now = func() time.Time { return *h.now.Load() }
	cfg.ValidityTTL = 10 * time.Second
	pool := o.pool
	if pool == nil {
		pool = h.api.Pool
	}
	con, err := console.New(console.Deps{Pool: pool, Log: zerolog.New(syncWriter{h.logs}), Config: cfg})
	require.NoError(t, err)
	return con
}

type syncWriter struct{ b *strings.Builder }

var logMu = make(chan struct{}, 1)

func (w syncWriter) Write(p []byte) (int, error) {
	logMu <- struct{}{}
	defer func() { <-logMu }()
	return w.b.Write(p)
}

func (h *harness) advance(d time.Duration) {
	n := h.now.Load().Add(d)
	h.now.Store(&n)
}

// browser is a client with a cookie jar that follows no redirects.
func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func post(t *testing.T, c *http.Client, u string, form url.Values) (int, string, http.Header) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// signIn signs c in with tok; it returns the sign-in's status (200 when
// signed in, the overview then answering) and the page's body.
func (h *harness) signIn(t *testing.T, c *http.Client, tok string) (int, string) {
	t.Helper()
	code, body, _ := get(t, c, h.srv.URL+"/console/signin")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `action="/console/signin"`)
	code, body, hdr := post(t, c, h.srv.URL+"/console/signin", url.Values{"token": {tok}})
	if code != http.StatusSeeOther {
		return code, body
	}
	require.Equal(t, "/console/", hdr.Get("Location"))
	code, body, _ = get(t, c, h.srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code)
	return http.StatusOK, body
}

// createNote creates a note through the API with an attachment when att
// is not empty, and returns its id.
func (h *harness) createNote(t *testing.T, tenant, token, key, title string) string {
	t.Helper()
	body := fmt.Sprintf(`{"title":%q,"body":"b"}`, title)
	resp, _ := apitest.PostNote(context.Background(), t, h.api.URL, token, key, []byte(body))
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	return strings.TrimPrefix(resp.Header.Get("Location"), "/v1/notes/")
}

// TestSignIn: pages need a session; the sign-in refuses a tenant token and
// a wrong token; over plain HTTP the session cookie is HttpOnly,
// SameSite=Strict, scoped to /console/ and not Secure; a revoked token's
// session ends within the validity TTL.
func TestSignIn(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)

	code, _, hdr := get(t, c, h.srv.URL+"/console/lookup?tenant=a&q=k")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/console/signin?next="+url.QueryEscape("/console/lookup?tenant=a&q=k"), hdr.Get("Location"))
	code, _, _ = get(t, c, h.srv.URL+"/console/overview.json")
	require.Equal(t, http.StatusForbidden, code, "a script's request is refused, not redirected")

	code, body := h.signIn(t, c, h.api.Token)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "A tenant token cannot sign in")
	code, body = h.signIn(t, c, "qo_00000000_"+strings.Repeat("A", 43))
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "not a valid operator token")

	resp, err := c.PostForm(h.srv.URL+"/console/signin", url.Values{"token": {h.opToken}, "next": {"/console/parked"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/console/parked", resp.Header.Get("Location"))
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == "quill_console" {
			session = ck
		}
	}
	require.NotNil(t, session)
	require.True(t, session.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, session.SameSite)
	require.Equal(t, "/console/", session.Path)
	require.False(t, session.Secure, "not over TLS")

	code, body, _ = get(t, c, h.srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "alice")
	require.Contains(t, h.logs.String(), `"console_action":"signin"`)

	// A tampered cookie is no session.
	tampered := browser(t)
	u, _ := url.Parse(h.srv.URL + "/console/")
	parts := strings.Split(session.Value, ".")
	require.Len(t, parts, 3, "key id, body, MAC")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), "alice", "mallo", 1))) + "." + parts[2]
	tampered.Jar.SetCookies(u, []*http.Cookie{{Name: "quill_console", Value: forged, Path: "/console/"}})
	code, _, _ = get(t, tampered, h.srv.URL+"/console/")
	require.Equal(t, http.StatusSeeOther, code)

	// Revoked: the session holds until the validity TTL, then ends.
	require.NoError(t, auth.Revoke(t.Context(), h.api.Pool, h.opToken, time.Now()))
	code, _, _ = get(t, c, h.srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code)
	h.advance(11 * time.Second)
	code, _, _ = get(t, c, h.srv.URL+"/console/")
	require.Equal(t, http.StatusSeeOther, code)

	// And a session expires.
	h2 := start(t)
	c2 := browser(t)
	code, _ = h2.signIn(t, c2, h2.opToken)
	require.Equal(t, http.StatusOK, code)
	h2.advance(console.DefaultSessionTTL + time.Second)
	code, _, _ = get(t, c2, h2.srv.URL+"/console/")
	require.Equal(t, http.StatusSeeOther, code)
}

// TestSecurityHeaders: every answer forbids inline scripts and framing and
// is not cached, and no page carries an inline script or handler.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	inline := regexp.MustCompile(`(?i)<script(?:\s[^>]*)?>\s*[^<\s]|\son[a-z]+\s*=|javascript:`)
	for _, p := range []string{"/console/", "/console/signin", "/console/lookup", "/console/lookup?tenant=x&q=k",
		"/console/parked", "/console/dead-letters", "/console/webhooks", "/console/nope", "/console/static/console.js"} {
		code, body, hdr := get(t, c, h.srv.URL+p)
		require.NotZero(t, code)
		csp := hdr.Get("Content-Security-Policy")
		require.Contains(t, csp, "script-src 'self'", p)
		require.NotContains(t, csp, "unsafe-inline", p)
		require.Contains(t, csp, "frame-ancestors 'none'", p)
		require.Equal(t, "no-store", hdr.Get("Cache-Control"), p)
		require.Equal(t, "nosniff", hdr.Get("X-Content-Type-Options"), p)
		if strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
			require.NotRegexp(t, inline, body, p)
		}
	}
}

// TestLookup: a key, the note id and the event id lead to the same chain;
// another tenant's note, an unknown key and a malformed id answer alike.
func TestLookup(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	note := h.createNote(t, h.api.Tenant, h.api.Token, "key-1", "first")

	lookup := func(tenant, by, q string) (int, string) {
		code, body, _ := get(t, c, h.srv.URL+"/console/lookup?"+url.Values{"tenant": {tenant}, "by": {by}, "q": {q}}.Encode())
		return code, body
	}
	code, body := lookup(h.api.Tenant, "key", "key-1")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `data-step="request"`)
	require.Contains(t, body, "create-note")
	// (Replays are counted by the API's replay counter, which apitest
	// does not run; the browser test against the real API shows them.)
	require.Contains(t, body, "1 request answered: 1 execution")
	require.Contains(t, body, note)
	require.Contains(t, body, "Event note.created")
	require.Contains(t, body, `<strong class="state">pending</strong>`)
	require.Contains(t, body, "NATS is not connected", "the stream is said to be unchecked")

	var event string
	require.NoError(t, h.api.Pool.QueryRow(t.Context(), `SELECT id::text FROM outbox_events WHERE aggregate_id = $1`, note).Scan(&event))
	for _, q := range [][2]string{{"note", note}, {"event", event}} {
		code, body := lookup(h.api.Tenant, q[0], q[1])
		require.Equal(t, http.StatusOK, code, q)
		require.Contains(t, body, "Operation <code>key-1</code>", q)
		require.Contains(t, body, "Found through "+q[0], q)
	}

	// Another tenant's note, event and key are not found — said exactly as
	// for ids that exist nowhere.
	other := "o-" + uuid.NewString()[:8]
	otherTok, err := auth.Create(t.Context(), h.api.Pool, other, time.Now())
	require.NoError(t, err)
	otherNote := h.createNote(t, other, otherTok, "key-2", "theirs")
	notFound := func(by, q string) string {
		code, body := lookup(h.api.Tenant, by, q)
		require.Equal(t, http.StatusNotFound, code, q)
		return strings.ReplaceAll(body, q, "Q")
	}
	want := notFound("note", uuid.NewString())
	require.Contains(t, want, "Not found.")
	require.Equal(t, want, notFound("note", otherNote))
	var otherEvent string
	require.NoError(t, h.api.Pool.QueryRow(t.Context(), `SELECT id::text FROM outbox_events WHERE aggregate_id = $1`, otherNote).Scan(&otherEvent))
	require.Equal(t, strings.ReplaceAll(notFound("event", uuid.NewString()), `value="event"`, ""), strings.ReplaceAll(notFound("event", otherEvent), `value="event"`, ""))
	require.Equal(t, notFound("key", "never-used"), notFound("key", "key-2"))

	// Past the outbox retention the cleanup deletes the event's row; the
	// record keeps it (a published one), and so does the chain.
	_, err = h.api.Pool.Exec(t.Context(), `UPDATE outbox_events SET published_at = now(), stream_seq = 7 WHERE aggregate_id = $1`, note)
	require.NoError(t, err)
	_, err = h.api.Pool.Exec(t.Context(), `DELETE FROM outbox_events WHERE aggregate_id = $1`, note)
	require.NoError(t, err)
	code, body = lookup(h.api.Tenant, "key", "key-1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, event)
	require.Contains(t, body, "Its outbox row was cleaned after the outbox retention")
	require.Contains(t, body, `sequence <span class="seq">7</span>`)

	// Malformed input is a 400 that says what is wrong.
	for _, tt := range [][3]string{{"Bad Tenant", "key", "k"}, {h.api.Tenant, "note", "not-a-uuid"}, {h.api.Tenant, "key", "a,b"}, {h.api.Tenant, "sql", "x"}} {
		code, body := lookup(tt[0], tt[1], tt[2])
		require.Equal(t, http.StatusBadRequest, code, tt)
		require.Contains(t, body, `class="error"`, tt)
	}
}

// patchNote sends PATCH /v1/notes/{id} with If-Match "ifMatch" under key,
// as an agent updates a note, and returns the status and body.
func (h *harness) patchNote(t *testing.T, key, id string, ifMatch int, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPatch, h.api.URL+"/v1/notes/"+id, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+h.api.Token)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("If-Match", fmt.Sprintf("%q", fmt.Sprint(ifMatch)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestLookupOfAnUpdate: an update's lookup shows its action, the version it
// made, its note.updated event and its state, and the note's version
// history; a 412's shows the version the note was at (current_version);
// an update that changed nothing shows no event. Keys in the history are
// escaped like every other value.
func TestLookupOfAnUpdate(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	note := h.createNote(t, h.api.Tenant, h.api.Token, "key-1", "first")
	const evil = `u<script>alert(1)</script>`
	code, body := h.patchNote(t, evil, note, 1, `{"title":"second"}`)
	require.Equal(t, http.StatusOK, code, body)
	code, body = h.patchNote(t, "stale", note, 1, `{"title":"third"}`)
	require.Equal(t, http.StatusPreconditionFailed, code, body)
	code, body = h.patchNote(t, "same", note, 2, `{"title":"second"}`)
	require.Equal(t, http.StatusOK, code, body)

	lookup := func(by, q string) string {
		t.Helper()
		code, body, _ := get(t, c, h.srv.URL+"/console/lookup?"+url.Values{"tenant": {h.api.Tenant}, "by": {by}, "q": {q}}.Encode())
		require.Equal(t, http.StatusOK, code, body)
		require.NotContains(t, body, "<script>alert", "escaped")
		return body
	}
	body = lookup("key", evil)
	require.Contains(t, body, "Operation <code>u&lt;script&gt;alert(1)&lt;/script&gt;</code>")
	require.Contains(t, body, `<span class="action">update-note</span>`)
	require.Contains(t, body, `answered <strong class="status">200</strong>`)
	require.Contains(t, body, `data-outcome="updated" data-version="2"`)
	require.Contains(t, body, "Outcome: updated: made version 2.")
	require.Contains(t, body, `Event note.updated — version <span class="event-version">2</span>`)
	require.Contains(t, body, `<strong class="state">pending</strong>`)
	require.Contains(t, body, `now at version <span class="note-version">2</span>`)
	require.Contains(t, body, "last updated")
	// The history: version 1 by the create, 2 by this update, each a link
	// to its operation's lookup.
	require.Contains(t, body, `<tr data-version="1" data-state="pending">`)
	require.Contains(t, body, `<tr data-version="2" data-state="pending">`)
	require.Contains(t, body, `href="/console/lookup?tenant=`+h.api.Tenant+`&amp;by=key&amp;q=key-1"`)
	require.Contains(t, body, `&amp;by=key&amp;q=u%3cscript%3ealert%281%29%3c%2fscript%3e"`, "query-escaped in a link")
	require.NotContains(t, body, `class="anomaly"`)

	// Through the note.updated event's id: the update's operation.
	var event string
	require.NoError(t, h.api.Pool.QueryRow(t.Context(), `SELECT id::text FROM outbox_events WHERE type = 'note.updated'`).Scan(&event))
	body = lookup("event", event)
	require.Contains(t, body, "Operation <code>u&lt;script&gt;alert(1)&lt;/script&gt;</code>")

	body = lookup("key", "stale")
	require.Contains(t, body, `answered <strong class="status">412</strong>`)
	require.Contains(t, body, `data-outcome="version_mismatch" data-current-version="2"`)
	require.Contains(t, body, "the note was at version 2 (current_version)")
	require.NotContains(t, body, "Event note.")

	body = lookup("key", "same")
	require.Contains(t, body, "Outcome: unchanged: the note stays at version 2 (no new version, no event).")
	require.NotContains(t, body, "Event note.")
}

// TestParkedPagesAndRetry: 10,000 parked events page by page, each page one
// bounded query; a retry from another origin is refused, one from the
// console goes through outbox.Unpark and is logged with the operator.
func TestParkedPagesAndRetry(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	ctx := t.Context()
	_, err := h.api.Pool.Exec(ctx, `INSERT INTO outbox_events (id, tenant, aggregate_id, type, payload, created_at, parked_at, parked_reason, attempts)
		SELECT gen_random_uuid(), 'acme', gen_random_uuid(), 'note.created', '{}', now(), now(), 'payload too large', 1
		FROM generate_series(1, 10000)`)
	require.NoError(t, err)

	seen := map[string]bool{}
	next, pages := "/console/parked?limit=500", 0
	rowRE := regexp.MustCompile(`data-event="([0-9a-f-]{36})"`)
	nextRE := regexp.MustCompile(`rel="next" href="([^"]+)"`)
	for next != "" {
		code, body, _ := get(t, c, h.srv.URL+strings.ReplaceAll(next, "&amp;", "&"))
		require.Equal(t, http.StatusOK, code)
		pages++
		for _, m := range rowRE.FindAllStringSubmatch(body, -1) {
			require.False(t, seen[m[1]], "an event on two pages")
			seen[m[1]] = true
		}
		next = ""
		if m := nextRE.FindStringSubmatch(body); m != nil {
			next = m[1] + "&limit=500"
		}
	}
	require.Len(t, seen, 10000)
	require.Equal(t, 20, pages)
	code, body, _ := get(t, c, h.srv.URL+"/console/parked")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, rowRE.FindAllString(body, -1), console.DefaultPageSize)
	code, _, _ = get(t, c, h.srv.URL+"/console/parked?after=-1")
	require.Equal(t, http.StatusBadRequest, code)

	var id string
	for id = range seen {
		break
	}
	code, body, _ = get(t, c, h.srv.URL+"/console/parked/retry?id="+id)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "payload too large")

	parked := func() bool {
		var p bool
		require.NoError(t, h.api.Pool.QueryRow(ctx, `SELECT parked_at IS NOT NULL FROM outbox_events WHERE id = $1`, id).Scan(&p))
		return p
	}
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/console/parked/retry", strings.NewReader(url.Values{"id": {id}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "another origin")
	require.True(t, parked(), "nothing refused changed anything")
	require.Contains(t, h.logs.String(), `"error_category":"console_cross_origin"`)

	code, _, hdr := post(t, c, h.srv.URL+"/console/parked/retry", url.Values{"id": {id}})
	require.Equal(t, http.StatusSeeOther, code)
	require.False(t, parked())
	_, body, _ = get(t, c, h.srv.URL+hdr.Get("Location"))
	require.Contains(t, body, "Event "+id+" is queued again")
	require.Contains(t, h.logs.String(), `"console_action":"retry_parked"`)
	require.Contains(t, h.logs.String(), `"operator":"alice"`)
	code, _, _ = post(t, c, h.srv.URL+"/console/parked/retry", url.Values{"id": {id}})
	require.Equal(t, http.StatusNotFound, code, "retried already")
	// The retry's message is made from an id, never taken from the URL.
	code, body, _ = get(t, c, h.srv.URL+"/console/parked?retried="+url.QueryEscape("<script>x</script>"))
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "<script>x")
	require.NotContains(t, body, "is queued again")
}

// TestOverview: the figures and the JSON the charts read.
func TestOverview(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	h.createNote(t, h.api.Tenant, h.api.Token, "k1", "one")
	h.createNote(t, h.api.Tenant, h.api.Token, "k2", "two")
	code, body, hdr := get(t, c, h.srv.URL+"/console/overview.json")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "application/json", hdr.Get("Content-Type"))
	require.Contains(t, body, `"pending":2`)
	require.Contains(t, body, `"parked":0`)
	require.Regexp(t, `"minutes":\[(\{[^}]*\},?){61}\]`, body)
	code, body, _ = get(t, c, h.srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `data-figure="pending">2<`)
}

// countedConsole is a console over a real API's database through a pool
// whose statements tr counts, with an operator token.
func countedConsole(t *testing.T) (*harness, *pgxpool.Pool, *countingTracer) {
	t.Helper()
	api := apitest.Start(t)
	tr := &countingTracer{}
	cfg := api.Pool.Config().Copy()
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	con, err := console.New(console.Deps{Pool: pool, Log: zerolog.Nop()})
	require.NoError(t, err)
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	h := &harness{api: api, srv: srv}
	h.opToken, err = auth.CreateOperator(t.Context(), pool, "alice", time.Now())
	require.NoError(t, err)
	return h, pool, tr
}

// countingTracer counts the statements a pool runs.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestLookupCostsNoMoreQueriesThanTheAudit: a signed-in lookup by key runs
// exactly the statements of "api audit --tenant T --key K" (audit.Run):
// the session costs none while its token is trusted.
func TestLookupCostsNoMoreQueriesThanTheAudit(t *testing.T) {
	t.Parallel()
	h, pool, tr := countedConsole(t)
	api, srv := h.api, h.srv
	h.createNote(t, api.Tenant, api.Token, "key-1", "first")
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)

	tr.n.Store(0)
	_, err := audit.Run(t.Context(), pool, nil, "not checked", audit.Config{Tenant: api.Tenant, Key: "key-1"})
	require.NoError(t, err)
	cli := tr.n.Load()

	tr.n.Store(0)
	code, _, _ := get(t, c, srv.URL+"/console/lookup?"+url.Values{"tenant": {api.Tenant}, "q": {"key-1"}}.Encode())
	require.Equal(t, http.StatusOK, code)
	page := tr.n.Load()
	t.Logf("statements: api audit --key %d, console lookup %d", cli, page)
	require.LessOrEqual(t, page, cli)
}

// TestDeadLetterRetry: the open dead letters of every consumer are listed,
// each under its consumer's name, and one consumer's on its own; a dead
// letter is republished through consumer.Store.Redrive, once, by its
// consumer and id — a pair of one consumer's name and another's id
// re-drives nothing; without NATS the page says so and the action is
// refused with 503.
func TestDeadLetterRetry(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	ns := natstest.Start(t)
	_, js := ns.Connect(t)
	ctx := t.Context()
	subj := "ct" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: strings.ToUpper(subj), Subjects: []string{subj + ".>"}})
	require.NoError(t, err)
	// A dead letter of the worker and one of a second consumer on the
	// package, the webhook dispatcher.
	type letter struct {
		id              int64
		consumer, event string
	}
	insert := func(name, reason string) letter {
		l := letter{consumer: name, event: uuid.NewString()}
		require.NoError(t, api.Pool.QueryRow(ctx, `INSERT INTO quill_consumer_dead_letters (consumer, event_id, event_type, stream_seq, subject, payload, headers, reason, deliveries, created_at)
			VALUES ($1, $2, '', 7, $3, '{"id":"x"}', '{}', $4, 5, now()) RETURNING id`,
			name, l.event, subj+".acme.note.created", reason).Scan(&l.id))
		return l
	}
	worker, hooks := insert("attachment-worker", "handler failed: boom"), insert("webhooks", "endpoint answered 500")
	open := func(l letter) bool {
		var o bool
		require.NoError(t, api.Pool.QueryRow(ctx, `SELECT retried_at IS NULL FROM quill_consumer_dead_letters WHERE id = $1`, l.id).Scan(&o))
		return o
	}
	retryForm := func(l letter) url.Values {
		return url.Values{"consumer": {l.consumer}, "id": {fmt.Sprint(l.id)}}
	}

	var connected atomic.Bool
	connected.Store(true)
	logs := &strings.Builder{}
	con, err := console.New(console.Deps{Pool: api.Pool, Log: zerolog.New(syncWriter{logs}), JetStream: func() jetstream.JetStream {
		if connected.Load() {
			return js
		}
		return nil
	}})
	require.NoError(t, err)
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	h := &harness{api: api, srv: srv}
	h.opToken, err = auth.CreateOperator(ctx, api.Pool, "bob", time.Now())
	require.NoError(t, err)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)

	code, body, _ := get(t, c, srv.URL+"/console/dead-letters")
	require.Equal(t, http.StatusOK, code)
	for _, l := range []letter{worker, hooks} {
		require.Contains(t, body, fmt.Sprintf(`data-dead-letter="%d" data-consumer="%s"`, l.id, l.consumer), "every consumer's")
		require.Contains(t, body, fmt.Sprintf(`href="/console/dead-letters/retry?consumer=%s&amp;id=%d"`, l.consumer, l.id))
	}
	require.Contains(t, body, "handler failed: boom")
	require.Contains(t, body, "endpoint answered 500")
	code, body, _ = get(t, c, srv.URL+"/console/dead-letters?consumer=webhooks")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, fmt.Sprintf(`data-dead-letter="%d"`, hooks.id))
	require.NotContains(t, body, fmt.Sprintf(`data-dead-letter="%d"`, worker.id), "one consumer's only")
	require.Contains(t, body, "Consumer <code>webhooks</code> only")
	code, body, _ = get(t, c, srv.URL+"/console/overview.json")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `"dead_letters":2,"dead_letters_by_consumer":[{"consumer":"attachment-worker","open":1},{"consumer":"webhooks","open":1}]`)
	code, body, _ = get(t, c, srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `data-figure="dead_letters">2<`)
	require.Contains(t, body, `<a href="/console/dead-letters?consumer=webhooks">webhooks</a> 1`)

	code, body, _ = get(t, c, srv.URL+"/console/dead-letters/retry?"+retryForm(hooks).Encode())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, hooks.event)
	require.Contains(t, body, `<input type="hidden" name="consumer" value="webhooks">`)
	require.Contains(t, body, fmt.Sprintf(`<input type="hidden" name="id" value="%d">`, hooks.id))

	// The worker's name with the dispatcher's id, and no name at all.
	forged := retryForm(hooks)
	forged.Set("consumer", worker.consumer)
	code, _, _ = get(t, c, srv.URL+"/console/dead-letters/retry?"+forged.Encode())
	require.Equal(t, http.StatusNotFound, code)
	code, _, _ = post(t, c, srv.URL+"/console/dead-letters/retry", forged)
	require.Equal(t, http.StatusNotFound, code, "a forged pair")
	code, _, _ = post(t, c, srv.URL+"/console/dead-letters/retry", url.Values{"id": {fmt.Sprint(hooks.id)}})
	require.Equal(t, http.StatusNotFound, code, "no consumer")
	require.True(t, open(hooks), "refused: not re-driven")
	require.Contains(t, logs.String(), fmt.Sprintf(`"console_action":"retry_dead_letter","consumer":"attachment-worker","dead_letter":%d,"found":false`, hooks.id))

	connected.Store(false)
	code, body, _ = get(t, c, srv.URL+"/console/dead-letters")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "not connected to NATS")
	code, _, _ = post(t, c, srv.URL+"/console/dead-letters/retry", retryForm(hooks))
	require.Equal(t, http.StatusServiceUnavailable, code)
	connected.Store(true)
	s, err := js.Stream(ctx, strings.ToUpper(subj))
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "nothing refused published anything")

	for seq, l := range []letter{hooks, worker} {
		code, _, hdr := post(t, c, srv.URL+"/console/dead-letters/retry", retryForm(l))
		require.Equal(t, http.StatusSeeOther, code)
		require.Equal(t, fmt.Sprintf("/console/dead-letters?consumer=%s&retried=%d&seq=%d", l.consumer, l.id, seq+1), hdr.Get("Location"))
		_, body, _ = get(t, c, srv.URL+hdr.Get("Location"))
		require.Contains(t, body, fmt.Sprintf("Dead letter %d is republished (stream sequence %d)", l.id, seq+1))
		require.False(t, open(l))
		msg, err := s.GetMsg(ctx, uint64(seq+1))
		require.NoError(t, err)
		require.Equal(t, l.event+":redrive:"+fmt.Sprint(l.id), msg.Header.Get("Nats-Msg-Id"))
		code, _, _ = post(t, c, srv.URL+"/console/dead-letters/retry", retryForm(l))
		require.Equal(t, http.StatusNotFound, code, "retried already: not published twice")
	}
	require.Contains(t, logs.String(), fmt.Sprintf(`"console_action":"retry_dead_letter","consumer":"webhooks","dead_letter":%d,"found":true`, hooks.id))
}

// TestListPagesCostNoMoreQueriesThanTheCLI: a page of parked events or dead
// letters is one statement, as "relay events list --parked" and
// "attachment-worker dead-letters list" are.
func TestListPagesCostNoMoreQueriesThanTheCLI(t *testing.T) {
	t.Parallel()
	h, pool, tr := countedConsole(t)
	srv := h.srv
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)

	tr.n.Store(0)
	_, err := outbox.ListParked(t.Context(), pool)
	require.NoError(t, err)
	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	_, err = store.DeadLetters(t.Context(), consumer.DeadLetterQuery{Consumer: "attachment-worker"})
	require.NoError(t, err)
	cli := tr.n.Load()
	tr.n.Store(0)
	for _, p := range []string{"/console/parked", "/console/dead-letters"} {
		code, _, _ := get(t, c, srv.URL+p)
		require.Equal(t, http.StatusOK, code)
	}
	pages := tr.n.Load()
	t.Logf("statements: the two CLI lists %d, the two pages %d", cli, pages)
	require.LessOrEqual(t, pages, cli)
}
