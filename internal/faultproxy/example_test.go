package faultproxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/quillhq/quill/internal/faultproxy"
)

// A client in front of the proxy loses the next response, although the
// server did the work; its retry gets an answer.
func Example() {
	var done atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		done.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()
	u, _ := url.Parse(api.URL)
	p, _ := faultproxy.New(faultproxy.Config{
		Upstream: u,
		Eligible: func(r *http.Request) bool { return r.Method == http.MethodPost }, // writes only
	})
	defer p.Close()
	front := httptest.NewServer(p)
	defer front.Close()

	p.DropNext(1)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	_, err := client.Post(front.URL+"/v1/notes", "application/json", strings.NewReader(`{}`))
	fmt.Println("first attempt failed:", err != nil, "- server executions:", done.Load())
	resp, _ := client.Post(front.URL+"/v1/notes", "application/json", strings.NewReader(`{}`))
	resp.Body.Close()
	fmt.Println("retry:", resp.StatusCode, "- server executions:", done.Load(), "- dropped:", p.Stats().Dropped)
	// Output:
	// first attempt failed: true - server executions: 1
	// retry: 201 - server executions: 2 - dropped: 1
}
