package httpapi_test

import (
	"encoding/base64"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/problem"
	"github.com/quillhq/quill/internal/testkit"
)

// Every path and method the API routes is in api/openapi.yaml, and the
// document describes nothing the API does not route; the routes served
// without a token are exactly those whose security is empty.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	t.Parallel()
	c := contractFor(t)
	// The model builds schemas lazily, as the validator does: not at
	// the same time as a validation (see contract.mu).
	c.mu.Lock()
	defer c.mu.Unlock()
	routed := map[string]bool{}
	public := map[string]bool{}
	for _, rt := range httpapi.Routes() {
		for _, m := range rt.Methods {
			routed[m+" "+rt.Pattern] = true
			public[m+" "+rt.Pattern] = rt.Public
		}
	}
	documented := map[string]bool{}
	for path, item := range c.model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			name := strings.ToUpper(method) + " " + path
			documented[name] = true
			if !routed[name] {
				continue
			}
			open := op.Security != nil && len(op.Security) == 0
			require.Equal(t, public[name], open, "%s: served without a token iff its security is []", name)
		}
	}
	require.Equal(t, slices.Sorted(maps.Keys(routed)), slices.Sorted(maps.Keys(documented)))
}

func TestOpenAPIDocumentIsServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.requireDocumentServed("/openapi.yaml", api.OpenAPI())
	r := b.mustDo(req{method: http.MethodPost, path: "/openapi.yaml", body: "{}", offContract: "POST is not served"})
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
}

// requireDocumentServed requires GET path to answer doc, byte for byte
// the embedded file, as YAML, without a token and despite a bad one.
func (b *testBundle) requireDocumentServed(path string, doc []byte) resp {
	t := b.t
	t.Helper()
	r := b.mustDo(req{method: http.MethodGet, path: path}) // no token
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "application/yaml", r.header.Get("Content-Type"))
	require.Equal(t, strconv.Itoa(len(doc)), r.header.Get("Content-Length"))
	require.Equal(t, string(doc), string(r.body), "the embedded api%s, byte for byte", path)
	require.NotEmpty(t, r.header.Get("X-Request-Id"))
	// With a token too; a bad one does not matter.
	bad := b.mustDo(req{method: http.MethodGet, path: path, header: map[string]string{"Authorization": "Bearer nope"}})
	require.Equal(t, http.StatusOK, bad.status)
	return r
}

// The problem codes of internal/problem are the document's, and the
// document's problem schema of each code has the status, title, type and
// retry advice that problem.New gives it.
func TestOpenAPIProblemCodes(t *testing.T) {
	t.Parallel()
	c := contractFor(t)
	// The model builds schemas lazily, as the validator does: not at
	// the same time as a validation (see contract.mu).
	c.mu.Lock()
	defer c.mu.Unlock()
	codes := problemCodes(t)
	var enum []string
	for _, n := range c.schema("Problem").Properties.GetOrZero("code").Schema().Enum {
		enum = append(enum, n.Value)
	}
	require.ElementsMatch(t, codes, enum, "the codes of internal/problem and of the Problem schema")

	perCode := map[string]bool{}
	for name, proxy := range c.model.Components.Schemas.FromOldest() {
		if !strings.HasSuffix(name, "Problem") || name == "Problem" {
			continue
		}
		consts := map[string]string{}
		for prop, ps := range proxy.Schema().Properties.FromOldest() {
			if k := ps.Schema().Const; k != nil {
				consts[prop] = k.Value
			}
		}
		code := consts["code"]
		require.NotEmpty(t, code, "%s fixes its code", name)
		perCode[code] = true
		status, err := strconv.Atoi(consts["status"])
		require.NoError(t, err, "%s fixes its status", name)
		p := problem.New(status, code, "detail")
		require.Equal(t, p.Type, consts["type"], name)
		require.Equal(t, p.Title, consts["title"], name)
		require.Equal(t, p.Retry, consts["retry"], name)
	}
	require.ElementsMatch(t, codes, slices.Collect(maps.Keys(perCode)), "one problem schema per code")
}

// problemCodes returns the values of contract's Code constants.
func problemCodes(t *testing.T) []string {
	t.Helper()
	codes := testkit.StringConstants(t, "../../contract/contract.go", "Code")
	require.NotEmpty(t, codes)
	return codes
}

// The attachment's processed and failed states, which only the attachment
// worker produces, answered by the reads and the lookup as the document
// says: each attachment is processed by internal/attachment and its outcome
// stored as the worker stores it.
func TestAttachmentOutcomesMatchTheContract(t *testing.T) {
	t.Parallel()
	b := setup(t)
	corrupt := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 64)...)
	files := []struct {
		key, filename, contentType string
		data                       []byte
		state                      string
		thumbnail                  int
	}{
		{"img", "gradient.png", "image/png", attachment.BenchFixturePNG64K(), "processed", http.StatusOK},
		{"txt", "words.txt", "text/plain; charset=utf-8", attachment.BenchFixtureText4K(), "processed", http.StatusNotFound},
		{"bad", "broken.png", "image/png", corrupt, "failed", http.StatusNotFound},
	}
	for _, f := range files {
		r := b.create(b.tokenA, f.key, map[string]any{"title": f.key, "attachment": map[string]any{
			"filename": f.filename, "content_type": f.contentType, "data": base64.StdEncoding.EncodeToString(f.data)}})
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
		note := r.json(t)
		att := note["attachment"].(map[string]any)
		id := note["id"].(string)

		res, err := attachment.Process(attachment.Input{ContentType: f.contentType, Filename: f.filename,
			Size: len(f.data), SHA256: att["sha256"].(string), Data: f.data}, attachment.Limits{})
		var (
			result, thumb []byte
			reason        *string
		)
		if perm := (*attachment.PermanentError)(nil); errors.As(err, &perm) {
			reason = &perm.Reason
		} else {
			require.NoError(t, err)
			result, err = res.JSON()
			require.NoError(t, err)
			if res.Thumbnail != nil {
				thumb = res.Thumbnail.PNG
			}
		}
		_, err = b.pool.Exec(t.Context(), `UPDATE attachments SET status = $2, result = $3::jsonb, reason = $4, thumbnail = $5, processed_at = now() WHERE id = $1`,
			att["id"], f.state, result, reason, thumb)
		require.NoError(t, err)

		detail := b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id + "/attachment", token: b.tokenA})
		require.Equal(t, http.StatusOK, detail.status)
		require.Equal(t, f.state, detail.json(t)["status"])
		th := b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id + "/attachment/thumbnail", token: b.tokenA})
		require.Equal(t, f.thumbnail, th.status, f.key)
		op := b.lookup(b.tokenA, f.key).json(t)
		effect := op["effects"].([]any)[1].(map[string]any)
		require.Equal(t, f.state, effect["state"])
		if reason != nil {
			require.Equal(t, *reason, effect["reason"], "a failed attachment's reason in the lookup")
		} else {
			require.NotContains(t, effect, "reason")
		}
		require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA}).status)
	}
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/notes?limit=100", token: b.tokenA}).status)
}
