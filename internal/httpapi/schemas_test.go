package httpapi_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/contract"
)

// Each event type's schema is served at /schemas/<type>.json without a
// token, byte for byte the embedded file.
func TestSchemasAreServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Len(t, api.SchemaTypes(), len(contract.EventTypes()))
	for _, typ := range api.SchemaTypes() {
		want, err := api.Schema(typ)
		require.NoError(t, err)
		path := "/schemas/" + typ + ".json"
		r := b.mustDo(req{method: http.MethodGet, path: path}) // no token
		require.Equal(t, http.StatusOK, r.status, path)
		require.Equal(t, "application/schema+json", r.header.Get("Content-Type"), path)
		require.Equal(t, strconv.Itoa(len(want)), r.header.Get("Content-Length"), path)
		require.Equal(t, string(want), string(r.body), path)
		require.NotEmpty(t, r.header.Get("X-Request-Id"), path)
		// A bad token does not matter.
		r = b.mustDo(req{method: http.MethodGet, path: path, header: map[string]string{"Authorization": "Bearer nope"}})
		require.Equal(t, http.StatusOK, r.status, path)
		r = b.mustDo(req{method: http.MethodHead, path: path})
		require.Equal(t, http.StatusOK, r.status, path)
		require.Empty(t, r.body, path)
	}
	r := b.mustDo(req{method: http.MethodPost, path: "/schemas/quill.note.created.v1.json", body: "{}", offContract: "POST is not served"})
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
}

// Any other name is a 404 problem, whatever it tries.
func TestUnknownSchemaIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{
		"/schemas/quill.note.created.v2.json",
		"/schemas/quill.note.created.v1", // the type without .json
		"/schemas/quill.note.created.v1.json.json",
		"/schemas/note.created.json",
		"/schemas/.json",
		"/schemas/openapi.yaml",
		"/schemas/..%2Fopenapi.yaml",
		"/schemas/..%2Fschemas%2Fquill.note.created.v1.json",
		"/schemas/%2E%2E.json",
		"/schemas/quill.note.created.v1%00.json",
	} {
		r := b.mustDo(req{method: http.MethodGet, path: path})
		require.Equal(t, http.StatusNotFound, r.status, path)
		require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), path)
		p := r.json(t)
		require.Equal(t, "not_found", p["code"], path)
		require.Contains(t, p["detail"], "quill.note.created.v1", "%s: the detail names the types there are", path)
	}
	// Not a file of the directory either.
	r := b.mustDo(req{method: http.MethodGet, path: "/schemas/", offContract: "no file named"})
	require.Equal(t, http.StatusNotFound, r.status)
	r = b.mustDo(req{method: http.MethodGet, path: "/schemas", offContract: "no file named"})
	require.Equal(t, http.StatusNotFound, r.status)
}
