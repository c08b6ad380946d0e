package faultproxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/faultproxy"
)

// bundle is an upstream that counts the requests it completed, and a
// proxy server in front of it.
type bundle struct {
	proxy     *faultproxy.Proxy
	url       string
	completed *atomic.Int64
	client    *http.Client
}

func setup(t *testing.T, cfg faultproxy.Config) *bundle {
	t.Helper()
	var completed atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		completed.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream-Path", r.URL.RequestURI())
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"echo":"` + string(b) + `","method":"` + r.Method + `"}`))
	}))
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	require.NoError(t, err)
	cfg.Upstream = u
	p, err := faultproxy.New(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &bundle{proxy: p, url: srv.URL, completed: &completed, client: &http.Client{Transport: tr}}
}

func (b *bundle) post(t *testing.T, path, body string) (*http.Response, string, error) {
	t.Helper()
	resp, err := b.client.Post(b.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	return resp, string(got), err
}

func TestPassThrough(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{})
	resp, body, err := b.post(t, "/v1/notes?x=1", "hi")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "/v1/notes?x=1", resp.Header.Get("X-Upstream-Path"))
	require.JSONEq(t, `{"echo":"hi","method":"POST"}`, body)
	require.Equal(t, faultproxy.Stats{Requests: 1, Forwarded: 1}, b.proxy.Stats())
}

func TestDropNext(t *testing.T) {
	t.Parallel()
	for _, mode := range []faultproxy.Mode{faultproxy.Abort, faultproxy.Truncate} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, faultproxy.Config{Mode: mode})
			b.proxy.DropNext(2)
			for i := range 2 {
				_, _, err := b.post(t, "/", "x")
				require.Error(t, err, "request %d: the response must be lost", i)
			}
			// The upstream completed both: the effect happened, the answer was lost.
			require.EqualValues(t, 2, b.completed.Load())
			resp, _, err := b.post(t, "/", "x")
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.Equal(t, faultproxy.Stats{Requests: 3, Forwarded: 3, Dropped: 2}, b.proxy.Stats())
		})
	}
}

func TestProbability(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{DropProbability: 1, Seed: 7})
	for range 5 {
		_, _, err := b.post(t, "/", "x")
		require.Error(t, err)
	}
	require.NoError(t, b.proxy.SetDropProbability(0))
	_, _, err := b.post(t, "/", "x")
	require.NoError(t, err)
	require.Error(t, b.proxy.SetDropProbability(1.5))
	require.EqualValues(t, 6, b.completed.Load())
	require.EqualValues(t, 5, b.proxy.Stats().Dropped)
}

func TestEligible(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var dropped []string
	b := setup(t, faultproxy.Config{
		DropProbability: 1,
		Eligible:        func(r *http.Request) bool { return r.Method == http.MethodPost },
		OnDrop: func(r *http.Request, status int) {
			mu.Lock()
			dropped = append(dropped, r.Method+" "+http.StatusText(status))
			mu.Unlock()
		},
	})
	resp, err := b.client.Get(b.url + "/")
	require.NoError(t, err)
	resp.Body.Close()
	_, _, err = b.post(t, "/", "x")
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"POST Created"}, dropped)
}

func TestUpstreamDown(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.NotFoundHandler())
	u, _ := url.Parse(up.URL)
	up.Close()
	p, err := faultproxy.New(faultproxy.Config{Upstream: u, DropProbability: 1})
	require.NoError(t, err)
	defer p.Close()
	srv := httptest.NewServer(p)
	defer srv.Close()
	resp, err := http.Post(srv.URL, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	require.Equal(t, faultproxy.Stats{Requests: 1, UpstreamErrors: 1}, p.Stats())
	http.DefaultClient.CloseIdleConnections()
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	_, err := faultproxy.New(faultproxy.Config{})
	require.Error(t, err)
	u, _ := url.Parse("http://127.0.0.1:1")
	_, err = faultproxy.New(faultproxy.Config{Upstream: u, DropProbability: -0.1})
	require.Error(t, err)
}

func TestAdminHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, faultproxy.Config{})
	admin := httptest.NewServer(faultproxy.AdminHandler(b.proxy))
	defer admin.Close()
	do := func(method, path string) int {
		req, _ := http.NewRequest(method, admin.URL+path, nil)
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusNoContent, do(http.MethodPost, "/drop-next?n=1"))
	require.Equal(t, http.StatusNoContent, do(http.MethodPost, "/mode?m=truncate"))
	require.Equal(t, http.StatusBadRequest, do(http.MethodPost, "/drop-probability?p=2"))
	_, _, err := b.post(t, "/", "x")
	require.Error(t, err)
	resp, err := b.client.Get(admin.URL + "/stats")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.JSONEq(t, `{"requests":1,"forwarded":1,"dropped":1,"upstream_errors":0}`, string(body))
}
