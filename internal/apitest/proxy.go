package apitest

import (
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/faultproxy"
)

// Proxy puts a response-dropping proxy configured by cfg (its Upstream is
// the API) in front of the API for the rest of the test, and returns it with
// the base URL that reaches the API through it.
func (a *API) Proxy(t testing.TB, cfg faultproxy.Config) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(a.URL)
	require.NoError(t, err)
	cfg.Upstream = u
	p, err := faultproxy.New(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	return p, front.URL
}
