package main

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/quillhq/quill/internal/faultproxy"
)

// lossyProxy is the fault-injecting proxy the demo's agent talks through,
// served on a loopback port of its own.
type lossyProxy struct {
	proxy *faultproxy.Proxy
	srv   *http.Server
	url   string
}

// startProxy serves a faultproxy in front of api on 127.0.0.1:0. It returns
// an error when the port cannot be opened.
func startProxy(api *url.URL) (*lossyProxy, error) {
	p, err := faultproxy.New(faultproxy.Config{Upstream: api, Mode: faultproxy.Abort})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return &lossyProxy{proxy: p, srv: srv, url: "http://" + ln.Addr().String()}, nil
}

func (l *lossyProxy) URL() string { return l.url }

// DropNext loses the next n responses after the API has answered them.
func (l *lossyProxy) DropNext(n int) { l.proxy.DropNext(n) }

func (l *lossyProxy) Close() {
	_ = l.srv.Close()
	l.proxy.Close()
}
