package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/testkit"
)

func TestDeleteNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create(b.tokenA, "c1", note("to delete")).json(t)["id"].(string)
	d := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "d1"})
	require.Equal(t, http.StatusOK, d.status, "%s", d.body)
	require.Equal(t, id, d.json(t)["id"])
	require.NotEmpty(t, d.json(t)["deleted_at"])

	again := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "d1"})
	require.Equal(t, http.StatusOK, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, string(d.body), string(again.body))

	require.Equal(t, http.StatusNotFound, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA}).status)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox_events WHERE type = 'note.deleted'`))

	// A new key deleting it again: 404, recorded and replayed as such.
	gone := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "d2"})
	require.Equal(t, http.StatusNotFound, gone.status)
	require.Equal(t, "not_found", gone.json(t)["code"])
	require.Equal(t, "application/problem+json", gone.header.Get("Content-Type"))
	require.Equal(t, 404.0, b.lookup(b.tokenA, "d2").json(t)["response"].(map[string]any)["status"])
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox_events WHERE type = 'note.deleted'`))

	// Another tenant cannot delete it, nor learn it exists.
	id2 := b.create(b.tokenA, "c2", note("mine")).json(t)["id"].(string)
	o := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id2, token: b.tokenB, key: "d3"})
	require.Equal(t, http.StatusNotFound, o.status)
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id2, token: b.tokenA}).status)

	// A malformed id is 404 and records nothing.
	m := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/not-a-uuid", token: b.tokenA, key: "d4", offContract: "malformed id"})
	require.Equal(t, http.StatusNotFound, m.status)
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "d4").status)
	require.Equal(t, 2.0, testkit.Gathered(t, b.reg, "quill_business_effects_total", map[string]string{"action": "create-note"}))
	require.Equal(t, 1.0, testkit.Gathered(t, b.reg, "quill_business_effects_total", map[string]string{"action": "delete-note"}))
}

func TestWritesNeedAValidKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, body: note("x"), offContract: "no key"})
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, "idempotency_key_missing", r.json(t)["code"])
	require.Equal(t, "after_fixing", r.json(t)["retry"])
	for _, k := range []string{`a, b`, `"a", "b"`, `a b`, `""`, strings.Repeat("k", 256), `"unterminated`} {
		r := b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: k, body: note("x"), offContract: "malformed key"})
		require.Equal(t, http.StatusBadRequest, r.status, k)
		require.Equal(t, "idempotency_key_invalid", r.json(t)["code"], k)
	}
	// A repeated header is invalid too.
	hr, err := http.NewRequest(http.MethodPost, b.srv.URL+"/v1/notes", strings.NewReader(`{"title":"x"}`))
	require.NoError(t, err)
	hr.Header.Set("Authorization", "Bearer "+b.tokenA)
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Add("Idempotency-Key", "a")
	hr.Header.Add("Idempotency-Key", "a")
	hr.Header.Set(offContractHeader, "repeated key")
	res, err := b.srv.Client().Do(hr)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Zero(t, b.count(`SELECT count(*) FROM operations`))
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, h := range map[string]string{
		"none":      "",
		"basic":     "Basic dXNlcjpwYXNz",
		"malformed": "Bearer nope",
		"unknown":   "Bearer qt_0123abcd_" + strings.Repeat("A", 43),
		"tampered":  "Bearer " + b.tokenA[:len(b.tokenA)-1] + "x",
	} {
		hdr := map[string]string{}
		if h != "" {
			hdr["Authorization"] = h
		}
		r := b.mustDo(req{method: http.MethodGet, path: "/v1/notes", header: hdr, offContract: "no valid token"})
		require.Equal(t, http.StatusUnauthorized, r.status, name)
		require.Equal(t, "unauthenticated", r.json(t)["code"], name)
		require.Equal(t, "after_fixing", r.json(t)["retry"], name)
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer", name)
	}
	// The tenant never comes from the body.
	r := b.mustDo(req{method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "k", body: map[string]any{"title": "x", "tenant": "globex"}, offContract: "unknown member"})
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, "invalid_json", r.json(t)["code"])
}

func TestListNotesPaginatesNewestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, b.create(b.tokenA, "k"+string(rune('a'+i)), note("n")).json(t)["id"].(string))
	}
	b.create(b.tokenB, "other", note("other"))
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		path := "/v1/notes?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		r := b.mustDo(req{method: http.MethodGet, path: path, token: b.tokenA})
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		m := r.json(t)
		for _, it := range m["items"].([]any) {
			got = append(got, it.(map[string]any)["id"].(string))
		}
		if m["next_cursor"] == nil {
			break
		}
		cursor = m["next_cursor"].(string)
		require.Less(t, page, 5)
	}
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, got)

	def := b.mustDo(req{method: http.MethodGet, path: "/v1/notes", token: b.tokenA}).json(t)
	require.Len(t, def["items"], 5)
	require.Nil(t, def["next_cursor"])

	for _, q := range []string{"limit=0", "limit=101", "limit=x", "limit=", "cursor=%%%", "cursor=abc"} {
		r := b.mustDo(req{method: http.MethodGet, path: "/v1/notes?" + q, token: b.tokenA, offContract: "invalid query"})
		require.Equal(t, http.StatusBadRequest, r.status, q)
		require.Equal(t, "validation_failed", r.json(t)["code"], q)
		require.NotEmpty(t, r.json(t)["errors"], q)
	}
}

func TestAttachmentEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.create(b.tokenA, "a1", map[string]any{"title": "with file", "attachment": map[string]any{
		"filename": "résumé \"final\".html", "content_type": "text/html; charset=utf-8", "data": b64("<script>alert(1)</script>")}})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	id := r.json(t)["id"].(string)
	meta := b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id + "/attachment", token: b.tokenA})
	require.Equal(t, http.StatusOK, meta.status)
	m := meta.json(t)
	require.Equal(t, "pending", m["status"])
	require.Equal(t, 25.0, m["size"])

	c := b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id + "/attachment/content", token: b.tokenA})
	require.Equal(t, http.StatusOK, c.status)
	require.Equal(t, "<script>alert(1)</script>", string(c.body))
	require.Equal(t, "text/html; charset=utf-8", c.header.Get("Content-Type"))
	require.Equal(t, "nosniff", c.header.Get("X-Content-Type-Options"))
	require.True(t, strings.HasPrefix(c.header.Get("Content-Disposition"), "attachment;"), c.header.Get("Content-Disposition"))

	require.Equal(t, http.StatusNotFound, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id + "/attachment/thumbnail", token: b.tokenA}).status)
	require.Equal(t, http.StatusNotFound, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id + "/attachment/content", token: b.tokenB}).status)

	plain := b.create(b.tokenA, "a2", note("no file")).json(t)["id"].(string)
	require.Equal(t, http.StatusNotFound, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + plain + "/attachment", token: b.tokenA}).status)

	// Over the decoded limit: 413, nothing recorded.
	big := strings.Repeat("a", 1<<20+1)
	tl := b.create(b.tokenA, "a3", map[string]any{"title": "big", "attachment": map[string]any{"filename": "b", "content_type": "text/plain", "data": b64(big)}})
	require.Equal(t, http.StatusRequestEntityTooLarge, tl.status)
	require.Equal(t, "payload_too_large", tl.json(t)["code"])
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "a3").status)
}

func TestRequestIDAndUnknownRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.mustDo(req{method: http.MethodGet, path: "/v1/notes", token: b.tokenA, header: map[string]string{"X-Request-Id": "abc.DEF_1-2"}})
	require.Equal(t, "abc.DEF_1-2", r.header.Get("X-Request-Id"))
	r = b.mustDo(req{method: http.MethodGet, path: "/v1/notes", token: b.tokenA, header: map[string]string{"X-Request-Id": "bad id!"}})
	require.NotEqual(t, "bad id!", r.header.Get("X-Request-Id"))
	require.Regexp(t, `^[A-Za-z0-9._-]{1,128}$`, r.header.Get("X-Request-Id"))
	r = b.mustDo(req{method: http.MethodGet, path: "/nope", token: b.tokenA, offContract: "unknown path"})
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	r = b.mustDo(req{method: http.MethodPut, path: "/v1/notes", token: b.tokenA, body: "{}", offContract: "unknown method"})
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	require.Equal(t, "GET, HEAD, POST", r.header.Get("Allow"))
	for _, id := range []string{"x", "00000000-0000-0000-0000-00000000000g", "{01a229cf-df18-7236-a349-3735bd4a95ce}"} {
		r = b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA, offContract: "malformed id"})
		require.Equal(t, http.StatusNotFound, r.status, id)
	}
}
