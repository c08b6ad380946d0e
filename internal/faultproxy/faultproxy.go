// Package faultproxy is an HTTP reverse proxy that loses responses on
// purpose: it forwards each request to the upstream, lets the upstream finish
// it (the write commits), reads the whole response, and then — with a
// configured probability, or for the next N eligible requests — aborts the
// connection to the client instead of answering. The client sees a
// transport error for a request whose effect happened: the lost post-commit
// response of the article, on demand. The fault suite (e2e/) and the demo put
// it in front of the API.
package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Mode is how a dropped response is lost.
type Mode int

const (
	// Abort closes the client's connection before a byte of the response
	// is written (the client reads EOF, or a reset).
	Abort Mode = iota
	// Truncate writes the status line, the headers and half the body, then
	// closes the connection (the client reads an unexpected EOF).
	Truncate
)

// String names the mode as the admin handler and logs spell it.
func (m Mode) String() string {
	if m == Truncate {
		return "truncate"
	}
	return "abort"
}

// DefaultMaxResponseBytes bounds the upstream response the proxy buffers.
const DefaultMaxResponseBytes = 64 << 20

// Config configures a Proxy. Only Upstream is required.
type Config struct {
	// Upstream is the server requests go to (scheme and host; a path is
	// prefixed to every request's path).
	Upstream *url.URL
	// DropProbability is the chance, 0 to 1, that an eligible response is
	// dropped. Default 0.
	DropProbability float64
	// Mode is how a response is dropped. Default Abort.
	Mode Mode
	// Eligible says which requests may lose their response (for example
	// writes only). Default: every request.
	Eligible func(*http.Request) bool
	// Seed seeds the drop decisions, for a reproducible run; 0 picks a
	// random seed.
	Seed uint64
	// Transport sends the requests upstream. Default: a dedicated
	// http.Transport without proxies or compression, closed by Close.
	Transport http.RoundTripper
	// MaxResponseBytes bounds the buffered upstream response; a larger one
	// is answered 502. Default DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// OnDrop, when set, is called after each dropped response with the
	// request and the upstream's status code.
	OnDrop func(r *http.Request, status int)
	// UpstreamTimeout bounds one upstream exchange. The exchange is not
	// cancelled when the client goes away: like a network that lost the
	// answer, the proxy lets the upstream finish. Default 60s.
	UpstreamTimeout time.Duration
}

// Stats counts what the proxy did. Requests = Forwarded + UpstreamErrors
// (+ requests still in flight); Dropped ≤ Forwarded.
type Stats struct {
	// Requests is every request the proxy received.
	Requests int64 `json:"requests"`
	// Forwarded is the requests the upstream answered.
	Forwarded int64 `json:"forwarded"`
	// Dropped is the upstream answers the client never got.
	Dropped int64 `json:"dropped"`
	// UpstreamErrors is the requests the upstream did not answer (refused,
	// reset, timed out); the client got 502.
	UpstreamErrors int64 `json:"upstream_errors"`
}

// Proxy is the fault-injecting reverse proxy; it is an http.Handler. Its
// methods are safe for concurrent use.
type Proxy struct {
	upstream  *url.URL
	transport http.RoundTripper
	owned     *http.Transport // closed by Close when the proxy made it
	eligible  func(*http.Request) bool
	maxBytes  int64
	onDrop    func(*http.Request, int)
	timeout   time.Duration

	mu       sync.Mutex
	rng      *rand.Rand
	prob     float64
	mode     Mode
	dropNext int
	stats    Stats
}

var _ http.Handler = (*Proxy)(nil)

// New returns a proxy to cfg.Upstream. It returns an error when the
// upstream is missing or not http(s), or the probability is outside [0, 1].
func New(cfg Config) (*Proxy, error) {
	u := cfg.Upstream
	if u == nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("faultproxy: Upstream must be an http(s) URL with a host")
	}
	if err := checkProbability(cfg.DropProbability); err != nil {
		return nil, err
	}
	p := &Proxy{upstream: u, transport: cfg.Transport, eligible: cfg.Eligible, maxBytes: cfg.MaxResponseBytes,
		onDrop: cfg.OnDrop, timeout: cfg.UpstreamTimeout, prob: cfg.DropProbability, mode: cfg.Mode}
	if p.timeout <= 0 {
		p.timeout = 60 * time.Second
	}
	if p.transport == nil {
		p.owned = &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}
		p.transport = p.owned
	}
	if p.eligible == nil {
		p.eligible = func(*http.Request) bool { return true }
	}
	if p.maxBytes <= 0 {
		p.maxBytes = DefaultMaxResponseBytes
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	p.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return p, nil
}

func checkProbability(v float64) error {
	if !(v >= 0 && v <= 1) { // also refuses NaN
		return fmt.Errorf("faultproxy: drop probability %v is not between 0 and 1", v)
	}
	return nil
}

// SetDropProbability changes the chance that an eligible response is
// dropped. It returns an error for a value outside [0, 1].
func (p *Proxy) SetDropProbability(v float64) error {
	if err := checkProbability(v); err != nil {
		return err
	}
	p.mu.Lock()
	p.prob = v
	p.mu.Unlock()
	return nil
}

// SetMode changes how responses are dropped.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	p.mode = m
	p.mu.Unlock()
}

// DropNext makes the next n eligible responses dropped, whatever the
// probability; n adds to any still outstanding. n ≤ 0 cancels them.
func (p *Proxy) DropNext(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n <= 0 {
		p.dropNext = 0
		return
	}
	p.dropNext += n
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close closes the idle upstream connections of the transport the proxy
// made itself. It does not stop a server serving the proxy.
func (p *Proxy) Close() {
	if p.owned != nil {
		p.owned.CloseIdleConnections()
	}
}

// hopHeaders are connection-level headers a proxy does not forward
// (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// ServeHTTP forwards r upstream, reads the whole answer and then either
// relays it or drops it. An upstream that does not answer gets the client a
// 502 (never dropped: nothing happened upstream that the client could miss).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.count(func(s *Stats) { s.Requests++ })
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), p.timeout)
	defer cancel()
	out := r.Clone(ctx)
	out.RequestURI = ""
	target := *p.upstream
	target.Path = singleJoin(p.upstream.Path, r.URL.Path)
	target.RawPath = ""
	if p.upstream.RawPath != "" || r.URL.RawPath != "" {
		target.RawPath = singleJoin(p.upstream.EscapedPath(), r.URL.EscapedPath())
	}
	target.RawQuery = r.URL.RawQuery
	out.URL = &target
	out.Host = p.upstream.Host
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	if r.ContentLength == 0 {
		out.Body = nil
	}
	resp, err := p.transport.RoundTrip(out)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(io.LimitReader(resp.Body, p.maxBytes+1))
		resp.Body.Close()
		if err == nil && int64(len(body)) > p.maxBytes {
			err = fmt.Errorf("upstream response over %d bytes", p.maxBytes)
		}
	}
	if err != nil {
		p.count(func(s *Stats) { s.UpstreamErrors++ })
		http.Error(w, "faultproxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	drop, mode := p.decide(r)
	p.count(func(s *Stats) {
		s.Forwarded++
		if drop {
			s.Dropped++
		}
	})
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = append([]string(nil), vs...)
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	if !drop {
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		return
	}
	if p.onDrop != nil {
		p.onDrop(r, resp.StatusCode)
	}
	if mode == Truncate && len(body) > 0 {
		h.Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body[:len(body)/2])
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	// The server closes the connection (HTTP/1) or resets the stream
	// (HTTP/2) without logging a stack trace.
	panic(http.ErrAbortHandler)
}

// decide reports whether r's response is dropped, and how.
func (p *Proxy) decide(r *http.Request) (bool, Mode) {
	if !p.eligible(r) {
		return false, Abort
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropNext > 0 {
		p.dropNext--
		return true, p.mode
	}
	return p.prob > 0 && p.rng.Float64() < p.prob, p.mode
}

func (p *Proxy) count(f func(*Stats)) {
	p.mu.Lock()
	f(&p.stats)
	p.mu.Unlock()
}

func singleJoin(a, b string) string {
	switch {
	case a == "":
		return b
	case a[len(a)-1] == '/' && len(b) > 0 && b[0] == '/':
		return a + b[1:]
	case a[len(a)-1] != '/' && (len(b) == 0 || b[0] != '/'):
		return a + "/" + b
	}
	return a + b
}

// AdminHandler lets a script steer p over HTTP:
//
//	GET  /stats                      the Stats as JSON
//	POST /drop-next?n=N              drop the next N eligible responses
//	POST /drop-probability?p=0.2     set the drop probability
//	POST /mode?m=abort|truncate      set how responses are dropped
func AdminHandler(p *Proxy) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		s := p.Stats()
		w.Header().Set("Content-Type", "application/json")
		var b bytes.Buffer
		fmt.Fprintf(&b, `{"requests":%d,"forwarded":%d,"dropped":%d,"upstream_errors":%d}`+"\n",
			s.Requests, s.Forwarded, s.Dropped, s.UpstreamErrors)
		_, _ = w.Write(b.Bytes())
	})
	mux.HandleFunc("POST /drop-next", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil {
			http.Error(w, "n must be an integer", http.StatusBadRequest)
			return
		}
		p.DropNext(n)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /drop-probability", func(w http.ResponseWriter, r *http.Request) {
		v, err := strconv.ParseFloat(r.URL.Query().Get("p"), 64)
		if err == nil {
			err = p.SetDropProbability(v)
		}
		if err != nil {
			http.Error(w, "p must be a number between 0 and 1", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /mode", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("m") {
		case "abort":
			p.SetMode(Abort)
		case "truncate":
			p.SetMode(Truncate)
		default:
			http.Error(w, "m must be abort or truncate", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}
