package httpapi_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/api"
)

// The AsyncAPI document is served without a token, byte for byte the
// embedded api/asyncapi.yaml, and a bad token does not stand in its way.
func TestAsyncAPIDocumentIsServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.mustDo(req{method: http.MethodGet, path: "/asyncapi.yaml"}) // no token
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "application/yaml", r.header.Get("Content-Type"))
	require.Equal(t, strconv.Itoa(len(api.AsyncAPI())), r.header.Get("Content-Length"))
	require.Equal(t, string(api.AsyncAPI()), string(r.body), "the embedded api/asyncapi.yaml, byte for byte")
	require.Contains(t, string(r.body), "asyncapi: 3.0.0")
	require.NotEmpty(t, r.header.Get("X-Request-Id"))

	r = b.mustDo(req{method: http.MethodGet, path: "/asyncapi.yaml", header: map[string]string{"Authorization": "Bearer nope"}})
	require.Equal(t, http.StatusOK, r.status)
	r = b.mustDo(req{method: http.MethodHead, path: "/asyncapi.yaml"})
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.body)
	r = b.mustDo(req{method: http.MethodDelete, path: "/asyncapi.yaml", offContract: "DELETE is not served"})
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
}
