package main

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
)

// api serve answers GET /v1/limits with the settings it was started with,
// and only to a valid token.
func TestLimitsAreTheServesSettings(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"QUILL_IDEMPOTENCY_RETENTION": "1h", "QUILL_KEY_RETENTION": "120m", "QUILL_MAX_BODY_BYTES": "4096",
		"QUILL_MAX_ATTACHMENT_BYTES": "1000", "QUILL_TENANT_CONCURRENCY": "7"}
	getenv := clitest.Env(vars)
	tok := createToken(t, getenv)
	p := startServe(t, vars)

	get := func(token string) (int, string) {
		r, err := http.NewRequest(http.MethodGet, "http://"+vars["QUILL_HTTP_ADDR"]+"/v1/limits", nil)
		require.NoError(t, err)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	code, body := get(tok)
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"response_retention": "1h", "key_retention": "2h", "max_body_bytes": 4096,
		"max_attachment_bytes": 1000, "tenant_concurrency": 7}`, body)
	code, body = get("")
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Contains(t, body, `"unauthenticated"`)
	require.NoError(t, p.Stop())
}
