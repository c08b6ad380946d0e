package httpapi_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/webhooks"
	"github.com/quillhq/quill/internal/whsecret"
)

// testBundle is one API over a fresh schema, with two tenants' tokens.
type testBundle struct {
	t    *testing.T
	pool *pgxpool.Pool
	srv  *httptest.Server
	// api is the handler itself, without the contract check in front
	// (which reads every request body before the API sees it).
	api http.Handler
	svc *notes.Service
	// webhookKeys seal the webhook secrets (nil: webhooks off).
	webhookKeys *whsecret.Keys
	reg         *prometheus.Registry
	// Two tenants, named uniquely per bundle: advisory locks are per
	// database, not per schema, so parallel tests must not share a
	// (tenant, key).
	tenantA, tokenA string
	tenantB, tokenB string
	clock           *fakeClock
	inFlight        atomic.Int64
	wrap            atomic.Pointer[func(http.Handler) http.Handler]
	proxy           *dbtest.Proxy
	// faulted: the fault table and triggers are installed
	// (faults_test.go).
	faulted bool
}

type setupOpts struct {
	maxConns int32
	wait     time.Duration
	// proxy puts a reply-losing proxy between the API and PostgreSQL.
	proxy bool
	// noCache turns the replay cache off: every replay reads the database.
	noCache bool
	// api is the API's Config (zero fields: the defaults).
	api httpapi.Config
	// lockTimeout and acquireTimeout are the notes service's (zero: the
	// defaults).
	lockTimeout, acquireTimeout time.Duration
	// tokenTTL caches tokens (zero: every request queries the database).
	tokenTTL time.Duration
	// responseRetention and keyRetention are the notes service's (zero:
	// the package's responseRetention and keyRetention).
	responseRetention, keyRetention time.Duration
	// noWebhooks runs the API without QUILL_WEBHOOK_SECRET_KEY.
	noWebhooks bool
	// log receives the API's log lines as JSON (nil: the test's log).
	log io.Writer
}

// standard is the default setup.
var standard = setupOpts{maxConns: 8, wait: 2 * time.Second}

type fakeClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

const (
	responseRetention = 72 * time.Hour
	keyRetention      = 720 * time.Hour
)

func setup(t *testing.T, opts ...setupOpts) *testBundle {
	t.Helper()
	o := setupOpts{maxConns: 8, wait: 2 * time.Second}
	if len(opts) > 0 {
		o = opts[0]
	}
	pool, dbURL := dbtest.Pool(t, o.maxConns)
	b := &testBundle{t: t, pool: pool, clock: &fakeClock{}}
	// The API's pool reaches PostgreSQL directly, or through PgBouncer in
	// transaction mode (TestIdempotencyThroughPgBouncer), and optionally
	// through the reply-losing proxy in front of either. The test's own
	// pool, with which it checks and provokes, is always direct.
	apiPool, apiURL := pool, dbURL
	if throughPgBouncer(t) {
		apiURL = dbtest.PgBouncer(t, dbURL)
	}
	if o.proxy {
		b.proxy, apiURL = dbtest.NewProxy(t, apiURL)
	}
	if apiURL != dbURL {
		var err error
		apiPool, err = db.Open(context.Background(), apiURL, o.maxConns)
		require.NoError(t, err)
		t.Cleanup(apiPool.Close)
	}
	b.reg = prometheus.NewRegistry()
	m := metrics.NewAPI(b.reg, contract.ActionCreateNote, contract.ActionDeleteNote)
	log := testkit.Logger(t)
	if o.log != nil {
		log = zerolog.New(o.log)
	}
	cacheBytes := 0
	if o.noCache {
		cacheBytes = -1
	}
	svc, err := notes.NewService(apiPool, notes.Config{ResponseRetention: cmp.Or(o.responseRetention, responseRetention), KeyRetention: cmp.Or(o.keyRetention, keyRetention), Wait: o.wait, ReplayCacheBytes: cacheBytes,
		LockTimeout: o.lockTimeout, AcquireTimeout: o.acquireTimeout},
		log, notes.WithObserver(m), notes.WithClock(b.clock.now))
	require.NoError(t, err)
	b.svc = svc
	// The suite sends bursts of one tenant's requests past the production
	// default of QUILL_TENANT_CONCURRENCY (100 waiters on one key) to test
	// coalescing, not admission: unless a test sets limits, they are out
	// of its way (overload_test.go tests them).
	if o.api.MaxConcurrency == 0 {
		o.api.MaxConcurrency = 1024
	}
	if o.api.TenantConcurrency == 0 {
		o.api.TenantConcurrency = 1024
	}
	var authn *auth.Authenticator // nil: uncached
	if o.tokenTTL > 0 {
		authn = auth.NewAuthenticator(apiPool, o.tokenTTL)
	}
	if !o.noWebhooks {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		b.webhookKeys, err = whsecret.ParseKeys(base64.StdEncoding.EncodeToString(key))
		require.NoError(t, err)
	}
	wh, err := webhooks.NewService(apiPool, notes.Config{ResponseRetention: cmp.Or(o.responseRetention, responseRetention), KeyRetention: cmp.Or(o.keyRetention, keyRetention), Wait: o.wait, ReplayCacheBytes: cacheBytes},
		b.webhookKeys, log, webhooks.WithObserver(m), webhooks.WithClock(b.clock.now))
	require.NoError(t, err)
	api := httpapi.NewServer(httpapi.Deps{Pool: apiPool, Auth: authn, Notes: svc, Webhooks: wh, Log: log, Metrics: m, Config: o.api})
	b.api = api
	// Every request that reaches the API, and every answer, is checked
	// against api/openapi.yaml (contract_test.go).
	check := contractFor(t)
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.inFlight.Add(1)
		defer b.inFlight.Add(-1)
		h := api
		if wrap := b.wrap.Load(); wrap != nil {
			h = (*wrap)(api)
		}
		check.serve(t, h, w, r)
	}))
	t.Cleanup(b.srv.Close)
	ctx := t.Context()
	suffix := strings.ToLower(uuid.NewString()[:8])
	b.tenantA, b.tenantB = "acme-"+suffix, "globex-"+suffix
	b.tokenA, err = auth.Create(ctx, pool, b.tenantA, time.Now())
	require.NoError(t, err)
	b.tokenB, err = auth.Create(ctx, pool, b.tenantB, time.Now())
	require.NoError(t, err)
	return b
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

type req struct {
	method, path, token, key string
	body                     any // string or []byte sent as is; other values marshaled
	header                   map[string]string
	noKey                    bool
	// offContract says why the request deliberately breaks the API's
	// contract; it is then not validated against api/openapi.yaml (its
	// answer still is).
	offContract string
}

func (b *testBundle) do(ctx context.Context, r req) (resp, error) {
	var body io.Reader
	switch v := r.body.(type) {
	case nil:
	case string:
		body = bytes.NewReader([]byte(v))
	case []byte:
		body = bytes.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			return resp{}, err
		}
		body = bytes.NewReader(raw)
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, b.srv.URL+r.path, body)
	if err != nil {
		return resp{}, err
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.key != "" && !r.noKey {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	if r.offContract != "" {
		hr.Header.Set(offContractHeader, r.offContract)
	}
	res, err := b.srv.Client().Do(hr)
	if err != nil {
		return resp{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return resp{}, err
	}
	return resp{status: res.StatusCode, header: res.Header, body: raw}, nil
}

func (b *testBundle) mustDo(r req) resp {
	b.t.Helper()
	out, err := b.do(b.t.Context(), r)
	require.NoError(b.t, err)
	return out
}

func (b *testBundle) create(token, key string, body any) resp {
	b.t.Helper()
	return b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: token, key: key, body: body})
}

func (b *testBundle) lookup(token, key string) resp {
	b.t.Helper()
	return b.mustDo(req{method: http.MethodGet, path: "/v1/operations/" + key, token: token})
}

// count runs a count(*) query.
func (b *testBundle) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (b *testBundle) notes(tenant string) int {
	return b.count(`SELECT count(*) FROM notes WHERE tenant = $1`, tenant)
}

// bothCaches runs test as two parallel subtests, over an API that replays
// from its cache and over one that reads every replay from the database.
func bothCaches(t *testing.T, test func(t *testing.T, b *testBundle)) {
	t.Helper()
	for _, noCache := range []bool{false, true} {
		t.Run(map[bool]string{false: "cached", true: "from the database"}[noCache], func(t *testing.T) {
			t.Parallel()
			test(t, setup(t, setupOpts{maxConns: 8, wait: 2 * time.Second, noCache: noCache}))
		})
	}
}

func note(title string) map[string]any { return map[string]any{"title": title} }

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
