package httpapi_test

import (
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/webhooks"
)

func hook(url string, types ...string) map[string]any {
	if len(types) == 0 {
		types = []string{"quill.note.created.v1"}
	}
	return map[string]any{"url": url, "event_types": types}
}

func (b *testBundle) createHook(token, key string, body any) resp {
	b.t.Helper()
	return b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks", token: token, key: key, body: body})
}

// secretAtRest reports whether any text or bytea column of any table in
// the schema holds s.
func (b *testBundle) secretAtRest(s string) []string {
	b.t.Helper()
	ctx := b.t.Context()
	rows, err := b.pool.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	require.NoError(b.t, err)
	var tables []string
	for rows.Next() {
		var name string
		require.NoError(b.t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(b.t, rows.Err())
	var found []string
	for _, table := range tables {
		var n int
		// The whole row as text: bytea columns appear as hex, so the
		// secret's bytes are searched in both forms.
		require.NoError(b.t, b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` t
			WHERE strpos(t::text, $1) > 0 OR strpos(t::text, $2) > 0`, s, hex.EncodeToString([]byte(s))).Scan(&n))
		if n > 0 {
			found = append(found, table)
		}
	}
	return found
}

func TestWebhookCreateReplaysTheSameSecret(t *testing.T) {
	t.Parallel()
	bothCaches(t, func(t *testing.T, b *testBundle) {
		body := hook("https://example.com/hooks", "quill.note.updated.v1", "quill.note.created.v1", "quill.note.created.v1")
		body["description"] = "ci"
		first := b.createHook(b.tokenA, "hook-1", body)
		require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
		m := first.json(t)
		secret := m["secret"].(string)
		require.True(t, strings.HasPrefix(secret, "whsec_"), secret)
		require.Equal(t, []any{"quill.note.created.v1", "quill.note.updated.v1"}, m["event_types"])
		require.Equal(t, "active", m["state"])
		require.Equal(t, "/v1/webhooks/"+m["id"].(string), first.header.Get("Location"))

		// The agent lost the 201: the retry answers the same bytes, the
		// same secret included.
		again := b.createHook(b.tokenA, "hook-1", body)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, string(first.body), string(again.body))
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))

		// Nowhere at rest: not in the endpoint's row, not in the
		// operation's recorded body.
		require.Empty(t, b.secretAtRest(secret))
		require.Empty(t, b.secretAtRest(strings.TrimPrefix(secret, "whsec_")))
		require.Equal(t, 1, b.count(`SELECT count(*) FROM webhook_endpoints WHERE tenant = $1`, b.tenantA))

		// The lookup shows the recorded answer without the secret.
		op := b.lookup(b.tokenA, "hook-1")
		require.Equal(t, http.StatusOK, op.status, "%s", op.body)
		require.NotContains(t, string(op.body), secret)
		require.Equal(t, "create-webhook", op.json(t)["action"])

		// Same key, other parameters: refused, naming them.
		other := b.createHook(b.tokenA, "hook-1", hook("https://example.com/other"))
		require.Equal(t, http.StatusUnprocessableEntity, other.status)
		require.Equal(t, "idempotency_key_reused", other.json(t)["code"])
		require.ElementsMatch(t, []any{"url", "event_types", "description"}, other.json(t)["fields"])
	})
}

func TestWebhookReadsListDeleteRotate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	created := b.createHook(b.tokenA, "h-1", hook("https://example.com/a"))
	require.Equal(t, http.StatusCreated, created.status, "%s", created.body)
	id := created.json(t)["id"].(string)
	secret := created.json(t)["secret"].(string)

	got := b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks/" + id, token: b.tokenA})
	require.Equal(t, http.StatusOK, got.status, "%s", got.body)
	require.NotContains(t, string(got.body), "secret")
	g := got.json(t)
	require.Equal(t, "active", g["state"])
	require.Equal(t, map[string]any{"last_attempt_at": nil, "last_delivery_at": nil, "last_status": nil,
		"last_error": nil, "failures_in_row": float64(0), "failing_since": nil}, g["health"])

	// The dispatcher's health row shows through.
	_, err := b.pool.Exec(t.Context(), `INSERT INTO webhook_endpoint_health (endpoint_id, state, disabled_at, disabled_reason, last_attempt_at, last_status, failures_in_row, failing_since)
		VALUES ($1, 'disabled', now(), 'gone', now(), 410, 3, now())`, id)
	require.NoError(t, err)
	got = b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks/" + id, token: b.tokenA})
	g = got.json(t)
	require.Equal(t, "disabled", g["state"])
	require.Equal(t, "gone", g["disabled_reason"])
	require.Equal(t, float64(410), g["health"].(map[string]any)["last_status"])

	second := b.createHook(b.tokenA, "h-2", hook("https://example.com/b"))
	require.Equal(t, http.StatusCreated, second.status)
	list := b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks", token: b.tokenA})
	require.Equal(t, http.StatusOK, list.status, "%s", list.body)
	require.NotContains(t, string(list.body), "secret")
	items := list.json(t)["items"].([]any)
	require.Len(t, items, 2)
	require.Equal(t, id, items[0].(map[string]any)["id"])
	require.Nil(t, list.json(t)["next_cursor"])

	// Rotate: a new secret; the previous one stays sealed for 24 hours.
	var sealedBefore []byte
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT secret_sealed FROM webhook_endpoints WHERE id = $1`, id).Scan(&sealedBefore))
	rot := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks/" + id + "/rotate-secret", token: b.tokenA, key: "rot-1"})
	require.Equal(t, http.StatusOK, rot.status, "%s", rot.body)
	r := rot.json(t)
	newSecret := r["secret"].(string)
	require.NotEqual(t, secret, newSecret)
	require.True(t, strings.HasPrefix(newSecret, "whsec_"))
	var (
		sealed, previous []byte
		until            time.Time
	)
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT secret_sealed, previous_secret_sealed, previous_secret_until FROM webhook_endpoints WHERE id = $1`, id).
		Scan(&sealed, &previous, &until))
	require.Equal(t, sealedBefore, previous)
	require.WithinDuration(t, time.Now().Add(webhooks.RotationOverlap), until, time.Minute)
	expires, err := time.Parse(time.RFC3339Nano, r["previous_secret_expires_at"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, until, expires, time.Millisecond)
	open, err := b.webhookKeys.Open(sealed, b.tenantA, id)
	require.NoError(t, err)
	require.Equal(t, newSecret, open)
	open, err = b.webhookKeys.Open(previous, b.tenantA, id)
	require.NoError(t, err)
	require.Equal(t, secret, open)
	replay := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks/" + id + "/rotate-secret", token: b.tokenA, key: "rot-1"})
	require.Equal(t, string(rot.body), string(replay.body))
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Empty(t, b.secretAtRest(newSecret))

	// A second rotation within the overlap keeps one previous secret: the
	// one it replaces; the first secret stops signing at once (docs/webhooks.md).
	rot2 := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks/" + id + "/rotate-secret", token: b.tokenA, key: "rot-1b"})
	require.Equal(t, http.StatusOK, rot2.status, "%s", rot2.body)
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT secret_sealed, previous_secret_sealed FROM webhook_endpoints WHERE id = $1`, id).
		Scan(&sealed, &previous))
	open, err = b.webhookKeys.Open(previous, b.tenantA, id)
	require.NoError(t, err)
	require.Equal(t, newSecret, open, "the secret the second rotation replaced signs beside the newest")
	open, err = b.webhookKeys.Open(sealed, b.tenantA, id)
	require.NoError(t, err)
	require.Equal(t, rot2.json(t)["secret"], open)

	// Rotation and delete require a key, as a note's delete does.
	noKey := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks/" + id + "/rotate-secret", token: b.tokenA, offContract: "no key"})
	require.Equal(t, http.StatusBadRequest, noKey.status)
	require.Equal(t, "idempotency_key_missing", noKey.json(t)["code"])
	noKey = b.mustDo(req{method: http.MethodDelete, path: "/v1/webhooks/" + id, token: b.tokenA, offContract: "no key"})
	require.Equal(t, "idempotency_key_missing", noKey.json(t)["code"])

	del := b.mustDo(req{method: http.MethodDelete, path: "/v1/webhooks/" + id, token: b.tokenA, key: "del-1"})
	require.Equal(t, http.StatusOK, del.status, "%s", del.body)
	require.Equal(t, id, del.json(t)["id"])
	again := b.mustDo(req{method: http.MethodDelete, path: "/v1/webhooks/" + id, token: b.tokenA, key: "del-1"})
	require.Equal(t, string(del.body), string(again.body))
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusNotFound, b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks/" + id, token: b.tokenA}).status)
	gone := b.mustDo(req{method: http.MethodDelete, path: "/v1/webhooks/" + id, token: b.tokenA, key: "del-2"})
	require.Equal(t, http.StatusNotFound, gone.status)
	gone = b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks/" + id + "/rotate-secret", token: b.tokenA, key: "rot-2"})
	require.Equal(t, http.StatusNotFound, gone.status)
	require.Len(t, b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks", token: b.tokenA}).json(t)["items"], 1)
	// Metrics name the route patterns, never an id.
	for route, method := range map[string]string{"/v1/webhooks": "GET", "/v1/webhooks/{id}": "DELETE", "/v1/webhooks/{id}/rotate-secret": "POST"} {
		require.Positive(t, testkit.Gathered(t, b.reg, "quill_http_requests_total", map[string]string{"route": route, "method": method, "code": "200"}), route)
	}
	require.Equal(t, http.StatusNotFound, b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks/not-a-uuid", token: b.tokenA, offContract: "a malformed id"}).status)
}

func TestWebhookTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.createHook(b.tokenA, "same", hook("https://example.com/a"))
	require.Equal(t, http.StatusCreated, a.status)
	id := a.json(t)["id"].(string)
	for _, r := range []req{
		{method: http.MethodGet, path: "/v1/webhooks/" + id, token: b.tokenB},
		{method: http.MethodDelete, path: "/v1/webhooks/" + id, token: b.tokenB, key: "b-del"},
		{method: http.MethodPost, path: "/v1/webhooks/" + id + "/rotate-secret", token: b.tokenB, key: "b-rot"},
	} {
		out := b.mustDo(r)
		require.Equal(t, http.StatusNotFound, out.status, "%s %s: %s", r.method, r.path, out.body)
	}
	require.Empty(t, b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks", token: b.tokenB}).json(t)["items"])
	// The same key in another tenant is another operation: another endpoint.
	other := b.createHook(b.tokenB, "same", hook("https://example.com/a"))
	require.Equal(t, http.StatusCreated, other.status)
	require.Empty(t, other.header.Get("Idempotent-Replayed"))
	require.NotEqual(t, id, other.json(t)["id"])
	require.NotEqual(t, a.json(t)["secret"], other.json(t)["secret"])
	// A's endpoint is untouched.
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks/" + id, token: b.tokenA}).status)
}

func TestWebhookLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range webhooks.MaxEndpoints {
		out := b.createHook(b.tokenA, "lim-"+uuid.NewString()[:8]+string(rune('a'+i)), hook("https://example.com/h"))
		require.Equal(t, http.StatusCreated, out.status, "%d: %s", i, out.body)
	}
	refused := b.createHook(b.tokenA, "lim-17", hook("https://example.com/h"))
	require.Equal(t, http.StatusUnprocessableEntity, refused.status, "%s", refused.body)
	require.Equal(t, "webhook_limit_reached", refused.json(t)["code"])
	// Recorded: the key answers it again, even once there is room.
	first := b.mustDo(req{method: http.MethodGet, path: "/v1/webhooks", token: b.tokenA}).json(t)["items"].([]any)[0].(map[string]any)["id"].(string)
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodDelete, path: "/v1/webhooks/" + first, token: b.tokenA, key: "lim-del"}).status)
	again := b.createHook(b.tokenA, "lim-17", hook("https://example.com/h"))
	require.Equal(t, string(refused.body), string(again.body))
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, http.StatusCreated, b.createHook(b.tokenA, "lim-18", hook("https://example.com/h")).status)
	require.Equal(t, webhooks.MaxEndpoints, b.count(`SELECT count(*) FROM webhook_endpoints WHERE tenant = $1 AND deleted_at IS NULL`, b.tenantA))
	// Another tenant has its own limit.
	require.Equal(t, http.StatusCreated, b.createHook(b.tokenB, "lim-17", hook("https://example.com/h")).status)
}

func TestWebhookValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"http", hook("http://example.com/h"), "url"},
		{"loopback", hook("https://127.0.0.1/h"), "url"},
		{"private", hook("https://10.0.0.7/h"), "url"},
		{"metadata", hook("https://169.254.169.254/h"), "url"},
		{"ULA", hook("https://[fd00::1]/h"), "url"},
		{"too long url", hook("https://example.com/" + strings.Repeat("a", 2100)), "url"},
		{"empty list", map[string]any{"url": "https://example.com", "event_types": []string{}}, "event_types"},
		{"missing url", map[string]any{"event_types": []string{"quill.note.created.v1"}}, "url"},
		{"too long description", map[string]any{"url": "https://example.com", "event_types": []string{"quill.note.created.v1"}, "description": strings.Repeat("d", 257)}, "description"},
	} {
		out := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks", token: b.tokenA, key: "v-" + tc.field, body: tc.body,
			offContract: "an invalid field, refused by the API's own rules"})
		require.Equal(t, http.StatusBadRequest, out.status, "%s: %s", tc.name, out.body)
		m := out.json(t)
		require.Equal(t, "validation_failed", m["code"], tc.name)
		require.Equal(t, tc.field, m["errors"].([]any)[0].(map[string]any)["field"], tc.name)
	}
	unknown := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks", token: b.tokenA, key: "v-u",
		body: hook("https://example.com", "quill.note.archived.v1"), offContract: "an unknown event type"})
	require.Equal(t, http.StatusBadRequest, unknown.status)
	require.Contains(t, string(unknown.body), "quill.note.archived.v1")
	member := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks", token: b.tokenA, key: "v-m",
		body: map[string]any{"url": "https://example.com", "event_types": []string{"quill.note.created.v1"}, "secret": "mine"}, offContract: "an unknown member"})
	require.Equal(t, http.StatusBadRequest, member.status)
	require.Equal(t, "invalid_json", member.json(t)["code"])
	noKey := b.mustDo(req{method: http.MethodPost, path: "/v1/webhooks", token: b.tokenA, body: hook("https://example.com"), offContract: "no key"})
	require.Equal(t, "idempotency_key_missing", noKey.json(t)["code"])
	require.Zero(t, b.count(`SELECT count(*) FROM webhook_endpoints WHERE tenant = $1`, b.tenantA))
}

func TestWebhooksNotConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxConns: 4, wait: 2 * time.Second, noWebhooks: true})
	for _, r := range []req{
		{method: http.MethodPost, path: "/v1/webhooks", token: b.tokenA, key: "k", body: hook("https://example.com")},
		{method: http.MethodGet, path: "/v1/webhooks", token: b.tokenA},
		{method: http.MethodGet, path: "/v1/webhooks/" + uuid.NewString(), token: b.tokenA},
		{method: http.MethodDelete, path: "/v1/webhooks/" + uuid.NewString(), token: b.tokenA, key: "k"},
		{method: http.MethodPost, path: "/v1/webhooks/" + uuid.NewString() + "/rotate-secret", token: b.tokenA, key: "k"},
	} {
		out := b.mustDo(r)
		require.Equal(t, http.StatusServiceUnavailable, out.status, "%s %s", r.method, r.path)
		m := out.json(t)
		require.Equal(t, "webhooks_not_configured", m["code"])
		require.Equal(t, "no", m["retry"])
	}
	// Notes are served as ever.
	require.Equal(t, http.StatusCreated, b.create(b.tokenA, "n", note("still")).status)
}

// Concurrent creates of one tenant take turns at the count: never more than
// the limit, however they interleave.
func TestWebhookLimitUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range webhooks.MaxEndpoints - 2 {
		require.Equal(t, http.StatusCreated, b.createHook(b.tokenA, "pre-"+string(rune('a'+i)), hook("https://example.com/h")).status)
	}
	const n = 6
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out, err := b.do(t.Context(), req{method: http.MethodPost, path: "/v1/webhooks", token: b.tokenA,
				key: "race-" + string(rune('a'+i)), body: hook("https://example.com/h")})
			if err == nil {
				statuses <- out.status
			}
		})
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	require.Equal(t, map[int]int{http.StatusCreated: 2, http.StatusUnprocessableEntity: n - 2}, count)
	require.Equal(t, webhooks.MaxEndpoints, b.count(`SELECT count(*) FROM webhook_endpoints WHERE tenant = $1 AND deleted_at IS NULL`, b.tenantA))
}
