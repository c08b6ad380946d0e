package daemon

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"

	"github.com/quillhq/quill/internal/config"
)

// Defaults of HTTPSettings (SPEC §2: QUILL_READ_TIMEOUT, QUILL_WRITE_TIMEOUT,
// QUILL_IDLE_TIMEOUT).
const (
	DefaultReadTimeout  = 30 * time.Second
	DefaultWriteTimeout = 60 * time.Second
	DefaultIdleTimeout  = 120 * time.Second
	// DefaultMaxConnections bounds the connections one server holds open:
	// four times the API's default QUILL_MAX_CONCURRENCY, so idle
	// keep-alive connections and a burst of slow ones leave room for the
	// requests the API would admit.
	DefaultMaxConnections = 1024
	// MaxHeaderBytes bounds a request's header block. Quill's requests
	// carry a token, a key of at most 255 characters and a few standard
	// fields; net/http's own default is 1 MiB.
	MaxHeaderBytes = 64 << 10
	// maxReadHeaderTimeout bounds the headers alone, within ReadTimeout:
	// a client that has not sent its headers after this long is not a
	// client Quill waits for.
	maxReadHeaderTimeout = 10 * time.Second
)

// HTTPSettings are the limits of every HTTP server of every process (the
// API and each admin server): how long a request may take to arrive, a
// response to leave, an idle connection to stay, and how many connections
// are open at once.
type HTTPSettings struct {
	// ReadTimeout bounds reading a request, headers and body
	// (QUILL_READ_TIMEOUT, default 30s): a body that never comes is
	// given up and its connection closed.
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its headers to the
	// end of its response (QUILL_WRITE_TIMEOUT, default 60s).
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a keep-alive connection waits for its
	// next request (QUILL_IDLE_TIMEOUT, default 120s).
	IdleTimeout time.Duration
	// MaxConnections is the most connections a server holds open
	// (QUILL_MAX_CONNECTIONS, default 1024); more wait in the kernel's
	// accept queue until one closes.
	MaxConnections int
}

// Define registers QUILL_READ_TIMEOUT, QUILL_WRITE_TIMEOUT,
// QUILL_IDLE_TIMEOUT and QUILL_MAX_CONNECTIONS on s.
func (h *HTTPSettings) Define(s *config.Set) {
	s.Duration(&h.ReadTimeout, "read-timeout", "QUILL_READ_TIMEOUT", DefaultReadTimeout, "longest to read a request, headers and body, on every HTTP server of the process")
	s.Duration(&h.WriteTimeout, "write-timeout", "QUILL_WRITE_TIMEOUT", DefaultWriteTimeout, "longest from a request's headers to the end of its response")
	s.Duration(&h.IdleTimeout, "idle-timeout", "QUILL_IDLE_TIMEOUT", DefaultIdleTimeout, "longest an idle keep-alive connection is kept")
	s.Int(&h.MaxConnections, "max-connections", "QUILL_MAX_CONNECTIONS", DefaultMaxConnections, 1, "connections each HTTP server of the process holds open at once; more wait to be accepted")
}

// WithDefaults returns h with zero fields set to their defaults.
func (h HTTPSettings) WithDefaults() HTTPSettings {
	if h.ReadTimeout <= 0 {
		h.ReadTimeout = DefaultReadTimeout
	}
	if h.WriteTimeout <= 0 {
		h.WriteTimeout = DefaultWriteTimeout
	}
	if h.IdleTimeout <= 0 {
		h.IdleTimeout = DefaultIdleTimeout
	}
	if h.MaxConnections <= 0 {
		h.MaxConnections = DefaultMaxConnections
	}
	return h
}

// Server returns an http.Server for handler with h's timeouts (zero fields
// take their defaults) and MaxHeaderBytes.
func (h HTTPSettings) Server(handler http.Handler) *http.Server {
	h = h.WithDefaults()
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(h.ReadTimeout, maxReadHeaderTimeout),
		ReadTimeout:       h.ReadTimeout,
		WriteTimeout:      h.WriteTimeout,
		IdleTimeout:       h.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Listen listens on addr (TCP) and accepts at most h.MaxConnections
// connections open at once; a request net/http cannot read is answered as
// a problem (RewritePlainError). It returns the listen error, wrapped with addr.
func (h HTTPSettings) Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	// Connections past the cap stay in the kernel's accept queue instead
	// of each holding a goroutine and a buffer.
	return problemListener{netutil.LimitListener(ln, h.WithDefaults().MaxConnections)}, nil
}
