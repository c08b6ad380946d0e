package httpapi_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/quillhq/quill/api"
)

// The AsyncAPI document is served without a token, byte for byte the
// embedded api/asyncapi.yaml, and a bad token does not stand in its way.
func TestAsyncAPIDocumentIsServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.requireDocumentServed("/asyncapi.yaml", api.AsyncAPI())
	require.Contains(t, string(r.body), "asyncapi: 3.0.0")
	r = b.mustDo(req{method: http.MethodHead, path: "/asyncapi.yaml"})
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.body)
	r = b.mustDo(req{method: http.MethodDelete, path: "/asyncapi.yaml", offContract: "DELETE is not served"})
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
}

// The document's references to the data schemas are relative, so that a
// document fetched from the API resolves them to the API's own
// /schemas/<type>.json: each one answers, without a token, with the
// schema file itself.
func TestAsyncAPIDataReferencesResolveOnTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var doc struct {
		Components struct {
			Messages map[string]struct {
				Name    string `yaml:"name"`
				Payload struct {
					AllOf []struct {
						Properties struct {
							Data struct {
								Ref string `yaml:"$ref"`
							} `yaml:"data"`
						} `yaml:"properties"`
					} `yaml:"allOf"`
				} `yaml:"payload"`
			} `yaml:"messages"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(api.AsyncAPI(), &doc))
	require.NotEmpty(t, doc.Components.Messages)
	base, err := url.Parse("http://quill.example/asyncapi.yaml") // where a consumer fetched it
	require.NoError(t, err)
	for name, m := range doc.Components.Messages {
		var refs []string
		for _, part := range m.Payload.AllOf {
			if r := part.Properties.Data.Ref; r != "" {
				refs = append(refs, r)
			}
		}
		require.Len(t, refs, 1, "%s refers to one data schema", name)
		ref, err := url.Parse(refs[0])
		require.NoError(t, err)
		require.False(t, ref.IsAbs() || strings.HasPrefix(ref.Path, "/"), "%s: the reference %s is relative", name, refs[0])
		target := base.ResolveReference(ref)
		r := b.mustDo(req{method: http.MethodGet, path: target.Path}) // no token
		require.Equal(t, http.StatusOK, r.status, "%s: GET %s", name, target.Path)
		want, err := api.Schema(m.Name)
		require.NoError(t, err, name)
		require.Equal(t, string(want), string(r.body), "%s: GET %s is the schema of %s", name, target.Path, m.Name)
	}
}
