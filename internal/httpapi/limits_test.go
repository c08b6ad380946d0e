package httpapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/httpapi"
)

// GET /v1/limits answers the settings the API was given, in the SPEC's
// shape (the contract check holds it to api/openapi.yaml), and the defaults
// when none were.
func TestLimitsAnswerTheConfiguredSettings(t *testing.T) {
	t.Parallel()
	opts := setupOpts{maxConns: 8, wait: 2 * time.Second, responseRetention: time.Hour, keyRetention: 2 * time.Hour,
		api: httpapi.Config{MaxBodyBytes: 4096, MaxAttachmentBytes: 1000, TenantConcurrency: 7}}
	b := setup(t, opts)
	r := b.mustDo(req{method: http.MethodGet, path: "/v1/limits", token: b.tokenA})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.JSONEq(t, `{"response_retention": "1h", "key_retention": "2h", "max_body_bytes": 4096,
		"max_attachment_bytes": 1000, "tenant_concurrency": 7}`, string(r.body))

	d := setup(t, setupOpts{maxConns: 8, wait: 2 * time.Second, api: httpapi.Config{TenantConcurrency: 32}})
	r = d.mustDo(req{method: http.MethodGet, path: "/v1/limits", token: d.tokenB})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.JSONEq(t, `{"response_retention": "72h", "key_retention": "720h", "max_body_bytes": 2097152,
		"max_attachment_bytes": 1048576, "tenant_concurrency": 32}`, string(r.body))
}

// The limits are the tenant's to read: no token, or a bad one, is 401.
func TestLimitsNeedAToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, h := range []map[string]string{nil, {"Authorization": "Bearer qt_00000000_nope"}, {"Authorization": "Basic eDp5"}} {
		r := b.mustDo(req{method: http.MethodGet, path: "/v1/limits", header: h, offContract: "no valid token"})
		require.Equal(t, http.StatusUnauthorized, r.status, "%v: %s", h, r.body)
		require.Equal(t, "unauthenticated", r.json(t)["code"])
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
	}
	r := b.mustDo(req{method: http.MethodPost, path: "/v1/limits", token: b.tokenA, body: "{}", offContract: "POST is not served"})
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
}

// A read of the limits takes a slot of its tenant's admission, as every
// authenticated request does: past QUILL_TENANT_CONCURRENCY it is 429, and
// another tenant is served meanwhile.
func TestLimitsCountAgainstTheTenantsAdmission(t *testing.T) {
	t.Parallel()
	opts := standard
	opts.api = httpapi.Config{MaxConcurrency: 8, TenantConcurrency: 1}
	b := setup(t, opts)
	entered, release := b.holdWrites("held")
	done := make(chan resp, 1)
	go func() { done <- b.create(b.tokenA, "held-1", note("held")) }()
	<-entered

	r := b.mustDo(req{method: http.MethodGet, path: "/v1/limits", token: b.tokenA})
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	require.Equal(t, "rate_limited", r.json(t)["code"])
	r = b.mustDo(req{method: http.MethodGet, path: "/v1/limits", token: b.tokenB})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)

	release()
	require.Equal(t, http.StatusCreated, (<-done).status)
	r = b.mustDo(req{method: http.MethodGet, path: "/v1/limits", token: b.tokenA})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
}
