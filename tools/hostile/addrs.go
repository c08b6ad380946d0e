package main

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// source is who a connection comes from: the last byte of its loopback
// address. A real attack's hosts are not the agents' host, and the API
// gives each source address a share of its connections (a quarter of
// QUILL_MAX_CONNECTIONS, decision 0072) and a budget of failed token
// lookups (decision 0042): with every client on 127.0.0.1 the attackers
// would spend the legitimate clients' share and budget. Linux routes all
// of 127.0.0.0/8 to the loopback interface, so a dialer bound to
// 127.0.0.N reaches a server on 127.0.0.1 from an address of its own.
type source byte

const (
	fromLegit     source = 1 // the legitimate clients and the token check
	fromSlowloris source = 2
	fromBadTokens source = 3
	fromFlood     source = 4
	fromBombs     source = 5
	fromInvented  source = 6 // invented HTTP methods
	fromIdle      source = 7 // one host's idle connections
	fromProbe     source = 8 // the health probe and the /metrics scrapes
)

// addr is s's loopback address.
func (s source) addr() netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(s)}) }

// sourcesLine says where each client connects from, for the report's
// header.
func sourcesLine(own bool) string {
	if !own {
		return "every client connects from this machine's one address (--url or --admin-url is not an IPv4 loopback address, so no address of their own can be chosen): the attackers share the legitimate clients' connection share and failed-lookup budget"
	}
	parts := []string{}
	for _, s := range []struct {
		name string
		s    source
	}{{"legitimate clients", fromLegit}, {"slowloris", fromSlowloris}, {"bad tokens", fromBadTokens}, {"flood", fromFlood},
		{"bombs", fromBombs}, {"invented methods", fromInvented}, {"idle host", fromIdle}, {"health probe and /metrics scrapes", fromProbe}} {
		parts = append(parts, s.name+" "+s.s.addr().String())
	}
	return "each client from a loopback address of its own (" + strings.Join(parts, ", ") +
		"): a real attack's hosts are not the agents' host, and each address has its own share of the API's connections (a quarter of QUILL_MAX_CONNECTIONS) and its own budget of failed token lookups"
}

// loopbackV4 says rawURL's host is an IPv4 loopback address: only then can
// a client choose another loopback address as its source ("localhost" may
// resolve to ::1, where no other source exists).
func loopbackV4(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(u.Hostname())
	return err == nil && a.Is4() && a.IsLoopback()
}

// dialer is a dialer for s's connections: bound to s's address when the
// run's servers are on IPv4 loopback, the system's choice otherwise.
func (c config) dialer(s source) *net.Dialer {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if c.ownAddrs {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(s.addr(), 0))
	}
	return d
}

// hostPort is rawURL's host:port, with the scheme's port when it names
// none.
func hostPort(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse %q: %w", rawURL, err)
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}
