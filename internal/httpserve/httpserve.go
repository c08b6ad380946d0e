// Package httpserve holds what every HTTP server of every Quill process
// shares: the timeouts and header limit of SPEC §2, a connection cap at
// which an idle connection makes room for a new one, a share of the cap
// per source address (SPEC §8 "Connections"), and the rewrite of net/http's
// plain-text error replies as problems. It imports no database driver, so
// that `quill mcp --http` serves with the same limits as the daemons.
package httpserve

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/quillhq/quill/internal/config"
)

// Defaults of Settings (SPEC §2: QUILL_READ_TIMEOUT, QUILL_WRITE_TIMEOUT,
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
	// AddressShareDivisor sets the share of MaxConnections one source
	// address may hold: a quarter, so that at least four hosts always
	// find room however the others behave, while one busy client (an
	// agent host, a load generator) still opens hundreds.
	AddressShareDivisor = 4
	// MaxHeaderBytes bounds a request's header block. Quill's requests
	// carry a token, a key of at most 255 characters and a few standard
	// fields; net/http's own default is 1 MiB.
	MaxHeaderBytes = 64 << 10
	// maxReadHeaderTimeout bounds the headers alone, within ReadTimeout:
	// a client that has not sent its headers after this long is not a
	// client Quill waits for.
	maxReadHeaderTimeout = 10 * time.Second
)

// Settings are the limits of every HTTP server of a process (the API, each
// admin server, `quill mcp --http`): how long a request may take to
// arrive, a response to leave, an idle connection to stay, how many
// connections are open at once and which peers are proxies whose
// connections carry many clients.
type Settings struct {
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
	// (QUILL_MAX_CONNECTIONS, default 1024). At the cap the idle
	// connection of the address holding the most is closed to make room;
	// with none idle, the next connection waits in the kernel's accept
	// queue. One address holds at most a quarter of it
	// (AddressShareDivisor) unless it is a trusted proxy.
	MaxConnections int
	// TrustedProxies are the networks of the load balancers or proxies
	// in front of the server (QUILL_TRUSTED_PROXIES, comma-separated
	// CIDRs or addresses; default none). Their connections carry many
	// clients, so they are exempt from the per-address share.
	TrustedProxies TrustedProxies
}

// Define registers QUILL_READ_TIMEOUT, QUILL_WRITE_TIMEOUT,
// QUILL_IDLE_TIMEOUT, QUILL_MAX_CONNECTIONS and QUILL_TRUSTED_PROXIES on s.
func (h *Settings) Define(s *config.Set) {
	s.Duration(&h.ReadTimeout, "read-timeout", "QUILL_READ_TIMEOUT", DefaultReadTimeout, "longest to read a request, headers and body, on every HTTP server of the process")
	s.Duration(&h.WriteTimeout, "write-timeout", "QUILL_WRITE_TIMEOUT", DefaultWriteTimeout, "longest from a request's headers to the end of its response")
	s.Duration(&h.IdleTimeout, "idle-timeout", "QUILL_IDLE_TIMEOUT", DefaultIdleTimeout, "longest an idle keep-alive connection is kept")
	s.Int(&h.MaxConnections, "max-connections", "QUILL_MAX_CONNECTIONS", DefaultMaxConnections, 1, "connections each HTTP server of the process holds open at once; at the cap an idle one makes room, and one address holds at most a quarter")
	s.Func("trusted-proxies", "QUILL_TRUSTED_PROXIES", "", "comma-separated CIDRs or addresses of the load balancers or proxies in front of the servers, exempt from the per-address connection share", func(v string) error {
		p, err := ParsePrefixes(v)
		h.TrustedProxies = p
		return err
	})
}

// ParsePrefixes parses a comma-separated list of CIDRs or single addresses
// (an address is its own /32 or /128); blanks around items are ignored and
// an empty list is none. Errors: the first item that is neither, named.
func ParsePrefixes(v string) (TrustedProxies, error) {
	var out TrustedProxies
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if p, err := netip.ParsePrefix(item); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an IP address nor a CIDR prefix (such as 10.0.0.0/8)", item)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// WithDefaults returns h with zero fields set to their defaults.
func (h Settings) WithDefaults() Settings {
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

// AddressShare is the most connections one source address other than a
// trusted proxy holds open at once: MaxConnections / AddressShareDivisor,
// at least 1.
func (h Settings) AddressShare() int {
	return max(h.WithDefaults().MaxConnections/AddressShareDivisor, 1)
}

// Listen listens on addr (TCP) with h's connection cap and per-address
// share; a request net/http cannot read is answered as a problem
// (RewritePlainError). Serve it with the server that Listener.Server
// returns, which tells the listener which connections are idle. It returns
// the listen error, wrapped with addr.
func (h Settings) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return newListener(ln, h.WithDefaults()), nil
}

// Server returns an http.Server for handler with the listener's timeouts
// and MaxHeaderBytes, reporting its connections' states to l so that an
// idle one can make room.
func (l *Listener) Server(handler http.Handler) *http.Server {
	h := l.settings
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(h.ReadTimeout, maxReadHeaderTimeout),
		ReadTimeout:       h.ReadTimeout,
		WriteTimeout:      h.WriteTimeout,
		IdleTimeout:       h.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnState:         l.connState,
	}
}
