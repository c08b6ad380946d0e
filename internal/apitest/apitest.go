// Package apitest runs the real Quill API in-process over a fresh PostgreSQL
// schema (internal/dbtest), for tests of the API's callers: the Go client,
// the quill CLI and the MCP server. Test-only.
package apitest

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/webhooks"
	"github.com/quillhq/quill/internal/whsecret"
)

// API is one running API with a tenant and its token.
type API struct {
	// URL is the API's base URL.
	URL string
	// Tenant and Token are a fresh tenant (unique per API: advisory locks
	// are per database, not per schema) and its bearer token.
	Tenant, Token string
	// Pool reaches the API's schema.
	Pool *pgxpool.Pool
	wrap atomic.Pointer[func(http.Handler) http.Handler]
}

// Start runs an API for the rest of the test, whose writes wait 2 s for a
// concurrent request of the same operation.
func Start(t testing.TB) *API {
	t.Helper()
	return StartWith(t, notes.Config{Wait: 2 * time.Second})
}

// StartWith runs an API whose notes and webhooks services have cfg for the
// rest of the test: a server with other horizons than the defaults. Its
// webhook secrets are sealed under a key of its own, and its endpoints
// must be public https URLs, as in production.
func StartWith(t testing.TB, cfg notes.Config) *API {
	t.Helper()
	pool, _ := dbtest.Pool(t, 16)
	log := zerolog.New(io.Discard)
	svc, err := notes.NewService(pool, cfg, log)
	require.NoError(t, err)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keys, err := whsecret.ParseKeys(base64.StdEncoding.EncodeToString(key))
	require.NoError(t, err)
	wh, err := webhooks.NewService(pool, cfg, keys, log, webhooks.WithTurns(svc.Turn))
	require.NoError(t, err)
	h := httpapi.NewServer(httpapi.Deps{Pool: pool, Notes: svc, Webhooks: wh, Log: log})
	a := &API{Pool: pool}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wrap := a.wrap.Load(); wrap != nil {
			(*wrap)(h).ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	a.URL = srv.URL
	a.Tenant = "t-" + strings.ToLower(uuid.NewString()[:8])
	a.Token, err = auth.Create(context.Background(), pool, a.Tenant, time.Now())
	require.NoError(t, err)
	return a
}

// Wrap puts middleware in front of the API for the rest of the test (nil
// removes it), to make it hang or fail on purpose.
func (a *API) Wrap(f func(http.Handler) http.Handler) {
	if f == nil {
		a.wrap.Store(nil)
		return
	}
	a.wrap.Store(&f)
}

// HoldFirstCreate makes the API hold the first POST /v1/notes from now on
// until release is closed, and then execute it even though its caller has
// gone: a host that cancels a call whose request is on the wire still gets
// its note created. arrived is closed when that request reaches the API.
// A test that ends without closing release (it failed first) has it closed
// when it ends, so that the held request does not hold the server's Close.
func (a *API) HoldFirstCreate(t testing.TB) (arrived <-chan struct{}, release chan struct{}) {
	in, out := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-out:
		default:
			close(out)
		}
	})
	var first atomic.Bool
	a.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/v1/notes" && first.CompareAndSwap(false, true) {
				close(in)
				<-out
				r = r.WithContext(context.WithoutCancel(r.Context()))
			}
			next.ServeHTTP(w, r)
		})
	})
	return in, out
}

// Notes counts the tenant's notes, deleted or not, with the given title
// ("" counts all).
func (a *API) Notes(t testing.TB, title string) int {
	t.Helper()
	var n int
	err := a.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM notes WHERE tenant = $1 AND ($2 = '' OR title = $2)`, a.Tenant, title).Scan(&n)
	require.NoError(t, err)
	return n
}
