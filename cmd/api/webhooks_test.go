package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
)

func postWebhook(t *testing.T, base, token, key, body string) (*http.Response, string) {
	t.Helper()
	r, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/webhooks", strings.NewReader(body))
	require.NoError(t, err)
	r.Header.Set("Authorization", "Bearer "+token)
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

// Another process, with the same QUILL_WEBHOOK_SECRET_KEY, replays a
// create with the same secret: the record holds it sealed, any API process
// opens it. Without the key the API starts, warns once and answers 503.
func TestWebhookSecretAcrossProcesses(t *testing.T) {
	t.Parallel()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	sealKey := base64.StdEncoding.EncodeToString(key)
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"QUILL_WEBHOOK_SECRET_KEY": sealKey}
	tok := createToken(t, clitest.Env(vars))
	base := "http://" + vars["QUILL_HTTP_ADDR"]
	body := `{"url":"https://example.com/hooks","event_types":["quill.note.created.v1"]}`

	p := startServe(t, vars)
	res, first := postWebhook(t, base, tok, "wh-restart", body)
	require.Equal(t, http.StatusCreated, res.StatusCode, first)
	require.Contains(t, first, `"secret":"whsec_`)
	require.NoError(t, p.Stop())
	require.NotContains(t, p.Stderr.String(), "webhooks_not_configured")
	require.NotContains(t, p.Stderr.String(), sealKey)

	p = startServe(t, vars)
	res, again := postWebhook(t, base, tok, "wh-restart", body)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	require.Equal(t, "true", res.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first, again)
	require.NoError(t, p.Stop())

	delete(vars, "QUILL_WEBHOOK_SECRET_KEY")
	p = startServe(t, vars)
	res, off := postWebhook(t, base, tok, "wh-restart", body)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	require.Contains(t, off, `"code":"webhooks_not_configured"`)
	require.NoError(t, p.Stop())
	warnings := 0
	for line := range strings.Lines(p.Stderr.String()) {
		if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, `"error_category":"webhooks_not_configured"`) {
			warnings++
		}
	}
	require.Equal(t, 1, warnings, "one warning at start-up: %s", p.Stderr.String())
}

func TestWebhookSettingsErrors(t *testing.T) {
	t.Parallel()
	getenv := func(env map[string]string) func(string) string {
		env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"
		return clitest.Env(env)
	}
	const secret = "c2VjcmV0LWJ1dC10b28tc2hvcnQ="
	_, _, err := clitest.RunOut(t, run, getenv(map[string]string{"QUILL_WEBHOOK_SECRET_KEY": secret}), "serve")
	var stderr bytes.Buffer
	require.Equal(t, 2, exitCode(err, &stderr))
	require.Contains(t, stderr.String(), `invalid QUILL_WEBHOOK_SECRET_KEY "(redacted)"`)
	require.NotContains(t, stderr.String(), secret)

	_, _, err = clitest.RunOut(t, run, getenv(map[string]string{"QUILL_WEBHOOK_ALLOW_PRIVATE": "maybe"}), "serve")
	stderr.Reset()
	require.Equal(t, 2, exitCode(err, &stderr))
	require.Contains(t, stderr.String(), "QUILL_WEBHOOK_ALLOW_PRIVATE")
}
