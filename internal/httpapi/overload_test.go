package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/httpapi"
)

// Past QUILL_TENANT_CONCURRENCY a tenant's request is answered 429
// rate_limited before its body is read — a body that never comes does not
// delay the answer — with Retry-After and the RateLimit headers, and
// nothing of it is executed or recorded; another tenant is served
// meanwhile, and the same request with the same key succeeds once a slot is
// free.
func TestTenantConcurrencyIsAdmittedBeforeTheBody(t *testing.T) {
	t.Parallel()
	opts := standard
	opts.api = httpapi.Config{MaxConcurrency: 8, TenantConcurrency: 2}
	b := setup(t, opts)
	entered, release := b.holdWrites("held")

	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			r := b.create(b.tokenA, fmt.Sprintf("held-%d", i), note("held"))
			require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
		})
	}
	<-entered
	<-entered

	// A third request of the tenant: refused without waiting for its
	// body, which never comes.
	r := b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "third", body: note("third")})
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	p := r.json(t)
	require.Equal(t, "rate_limited", p["code"])
	require.Equal(t, "same_key", p["retry"])
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, `"server";q=8;qu="concurrent-requests", "tenant";q=2;qu="concurrent-requests"`, r.header.Get("RateLimit-Policy"))
	require.Equal(t, `"tenant";r=0;t=1`, r.header.Get("RateLimit"))
	require.Equal(t, 0, b.count(`SELECT count(*) FROM operations WHERE tenant = $1 AND key = 'third'`, b.tenantA), "nothing recorded")

	direct := httptest.NewServer(b.api) // no contract check, which would read the body first
	t.Cleanup(direct.Close)
	body, never := io.Pipe()
	t.Cleanup(func() { never.Close() })
	hr, err := http.NewRequestWithContext(t.Context(), http.MethodPost, direct.URL+"/v1/notes", body)
	require.NoError(t, err)
	hr.ContentLength = 100000
	hr.Header.Set("Authorization", "Bearer "+b.tokenA)
	hr.Header.Set("Idempotency-Key", "no-body")
	hr.Header.Set("Content-Type", "application/json")
	start := time.Now()
	res, err := direct.Client().Do(hr)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.Less(t, time.Since(start), 2*time.Second, "answered without waiting for the body")

	// Another tenant is not limited by this one's flood; reads count
	// against the tenant too.
	require.Equal(t, http.StatusCreated, b.create(b.tokenB, "other", note("other")).status)
	require.Equal(t, http.StatusTooManyRequests, b.mustDo(req{method: http.MethodGet, path: "/v1/notes", token: b.tokenA}).status)

	release()
	wg.Wait()
	require.Equal(t, http.StatusCreated, b.create(b.tokenA, "third", note("third")).status, "the same key once a slot is free")
}

// Past QUILL_TENANT_RATE (a bucket of one second of it) a tenant's
// requests are answered 429 naming the "tenant-rate" policy, with nothing
// executed or recorded, however few it has in flight; another tenant has a
// bucket of its own; the same key succeeds once the bucket refills.
func TestTenantRateIsABucketPerTenant(t *testing.T) {
	t.Parallel()
	opts := standard
	opts.api = httpapi.Config{MaxConcurrency: 8, TenantConcurrency: 8, TenantRate: 2, TenantBurst: 3}
	b := setup(t, opts)
	for i := range 3 {
		r := b.create(b.tokenA, fmt.Sprintf("burst-%d", i), note("burst"))
		require.Equal(t, http.StatusCreated, r.status, "within the burst: %s", r.body)
	}
	r := b.create(b.tokenA, "past", note("past"))
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	p := r.json(t)
	require.Equal(t, "rate_limited", p["code"])
	require.Equal(t, "same_key", p["retry"])
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, `"server";q=8;qu="concurrent-requests", "tenant";q=8;qu="concurrent-requests", "tenant-rate";q=3;w=2`, r.header.Get("RateLimit-Policy"))
	require.Equal(t, `"tenant-rate";r=0;t=1`, r.header.Get("RateLimit"))
	require.Equal(t, 0, b.count(`SELECT count(*) FROM operations WHERE tenant = $1 AND key = 'past'`, b.tenantA), "nothing recorded")
	require.Equal(t, http.StatusTooManyRequests, b.mustDo(req{method: http.MethodGet, path: "/v1/notes", token: b.tokenA}).status, "reads count too")

	require.Equal(t, http.StatusCreated, b.create(b.tokenB, "other", note("other")).status, "another tenant's bucket is its own")

	require.Eventually(t, func() bool { return b.create(b.tokenA, "past", note("past")).status == http.StatusCreated },
		5*time.Second, 100*time.Millisecond, "the same key once the bucket refills")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM notes WHERE tenant = $1 AND title = 'past'`, b.tenantA))
}

// Past QUILL_MAX_CONCURRENCY every request is refused, of any tenant and
// of the public routes; the answer names the server's policy.
func TestMaxConcurrencyRefusesEveryone(t *testing.T) {
	t.Parallel()
	opts := standard
	opts.api = httpapi.Config{MaxConcurrency: 2, TenantConcurrency: 2}
	b := setup(t, opts)
	entered, release := b.holdWrites("held")
	var wg sync.WaitGroup
	for i, tok := range []string{b.tokenA, b.tokenB} {
		wg.Go(func() { b.create(tok, fmt.Sprintf("held-%d", i), note("held")) })
	}
	<-entered
	<-entered
	for _, r := range []req{
		{method: http.MethodGet, path: "/v1/notes", token: b.tokenB},
		{method: http.MethodGet, path: "/openapi.yaml"},
	} {
		res := b.mustDo(r)
		require.Equal(t, http.StatusTooManyRequests, res.status, "%s %s: %s", r.method, r.path, res.body)
		require.Equal(t, `"server";r=0;t=1`, res.header.Get("RateLimit"))
	}
	// The server's slot is taken after the token check and the tenant's
	// slot: a malformed token is refused as such, taking no slot.
	res := b.mustDo(req{method: http.MethodGet, path: "/v1/notes", token: "qt_00000000_nope", offContract: "a malformed token"})
	require.Equal(t, http.StatusUnauthorized, res.status, "%s", res.body)
	release()
	wg.Wait()
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/notes", token: b.tokenB}).status)
}

// A write waits no longer than the lock timeout for a note another
// transaction holds (a worker's batch holds FOR UPDATE on its notes): it
// answers 503 unavailable, retry same_key, with Retry-After and nothing
// committed; the same key succeeds once the lock is released.
func TestDeleteOfALockedNoteAnswersWithinTheLockTimeout(t *testing.T) {
	t.Parallel()
	const lockTimeout = 300 * time.Millisecond
	b := setup(t, setupOpts{maxConns: 8, wait: 2 * time.Second, lockTimeout: lockTimeout})
	created := b.create(b.tokenA, "to-delete", note("locked"))
	require.Equal(t, http.StatusCreated, created.status)
	id := created.json(t)["id"].(string)

	tx, err := b.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(t.Context(), `SELECT id FROM notes WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)

	start := time.Now()
	r := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "del-locked"})
	took := time.Since(start)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	require.Less(t, took, lockTimeout+2*time.Second, "answered within the lock timeout, not after the write timeout")
	p := r.json(t)
	require.Equal(t, "unavailable", p["code"])
	require.Equal(t, "same_key", p["retry"])
	require.Contains(t, p["detail"], "locked")
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, 0, b.count(`SELECT count(*) FROM operations WHERE tenant = $1 AND key = 'del-locked'`, b.tenantA), "nothing committed")

	require.NoError(t, tx.Rollback(t.Context()))
	r = b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "del-locked"})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
}

// A request that finds every pool connection busy waits no longer than the
// acquire timeout and answers 503 unavailable with Retry-After, for reads
// and writes alike.
func TestBusyPoolAnswers503WithinTheAcquireTimeout(t *testing.T) {
	t.Parallel()
	const acquireTimeout = 300 * time.Millisecond
	b := setup(t, setupOpts{maxConns: 2, wait: 2 * time.Second, acquireTimeout: acquireTimeout, tokenTTL: time.Minute})
	if throughPgBouncer(t) {
		t.Skip("the API's pool is not the test's")
	}
	created := b.create(b.tokenA, "first", note("first")) // the token is cached from here on
	require.Equal(t, http.StatusCreated, created.status)
	id := created.json(t)["id"].(string)

	var held []interface{ Release() }
	for range 2 {
		c, err := b.pool.Acquire(t.Context())
		require.NoError(t, err)
		held = append(held, c)
	}
	for _, r := range []req{
		{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA},
		{method: http.MethodGet, path: "/v1/notes", token: b.tokenA},
		{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "second", body: note("second")},
	} {
		start := time.Now()
		res := b.mustDo(r)
		require.Equal(t, http.StatusServiceUnavailable, res.status, "%s %s: %s", r.method, r.path, res.body)
		require.Less(t, time.Since(start), acquireTimeout+2*time.Second)
		require.Equal(t, "1", res.header.Get("Retry-After"))
		require.Contains(t, res.json(t)["detail"], "connection")
	}
	for _, c := range held {
		c.Release()
	}
	require.Equal(t, http.StatusCreated, b.create(b.tokenA, "second", note("second")).status)
}

// A list page is capped by bytes as well as by limit: large notes end a page
// early, with a next_cursor, and following the cursors yields every note
// exactly once; a single note larger than the cap still makes a page.
func TestListPagesAreCappedByBytes(t *testing.T) {
	t.Parallel()
	const capBytes = 5000
	b := setup(t, setupOpts{maxConns: 8, wait: 2 * time.Second, api: httpapi.Config{MaxListBytes: capBytes}})
	want := map[string]bool{}
	for i := range 7 {
		body := strings.Repeat("x", 1500)
		if i == 3 {
			body = strings.Repeat("y", 8000) // alone larger than the cap
		}
		r := b.create(b.tokenA, fmt.Sprintf("big-%d", i), map[string]any{"title": fmt.Sprintf("n%d", i), "body": body})
		require.Equal(t, http.StatusCreated, r.status)
		want[r.json(t)["id"].(string)] = true
	}
	got := map[string]bool{}
	path := "/v1/notes?limit=100"
	pages := 0
	for {
		r := b.mustDo(req{method: http.MethodGet, path: path, token: b.tokenA})
		require.Equal(t, http.StatusOK, r.status)
		page := r.json(t)
		items := page["items"].([]any)
		require.NotEmpty(t, items)
		if len(items) > 1 {
			require.LessOrEqual(t, len(r.body), capBytes+200, "a page of several notes stays near the cap")
		}
		for _, it := range items {
			id := it.(map[string]any)["id"].(string)
			require.False(t, got[id], "note %s twice", id)
			got[id] = true
		}
		pages++
		next, _ := page["next_cursor"].(string)
		if next == "" {
			break
		}
		path = "/v1/notes?limit=100&cursor=" + next
	}
	require.Equal(t, want, got)
	require.Greater(t, pages, 2, "the cap split the list")
}

// Distinct bad tokens from one address spend its budget of failed lookups
// (decision 0042): past it they are answered 429 rate_limited with the
// RateLimit fields of the "auth" policy, which the OpenAPI document's 429
// holds them to (every answer here passes the contract check); a cached
// valid token from the same address is still served.
func TestFailedAuthenticationsPastTheBudgetAre429(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{tokenTTL: time.Minute})
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "warm").status, "the valid token cached")
	codes := map[int]int{}
	var last resp
	for i := range auth.DefaultFailureBurst + 3 {
		r := b.lookup(fmt.Sprintf("qt_%08x_%s", i, strings.Repeat("A", 43)), "k")
		codes[r.status]++
		if r.status == http.StatusTooManyRequests {
			last = r
		}
	}
	require.Equal(t, map[int]int{http.StatusUnauthorized: auth.DefaultFailureBurst, http.StatusTooManyRequests: 3}, codes)
	p := last.json(t)
	require.Equal(t, "rate_limited", p["code"])
	require.Equal(t, "same_key", p["retry"])
	require.Equal(t, `"auth";r=0;t=`+last.header.Get("Retry-After"), last.header.Get("RateLimit"))
	require.Contains(t, last.header.Get("RateLimit-Policy"), `"auth";q=`)
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "still").status, "a cached valid token is not limited")
}
