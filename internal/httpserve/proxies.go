package httpserve

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies are the peers (reverse proxies, load balancers) whose
// X-Forwarded-Proto and X-Forwarded-For are believed (the console's
// cookie and sign-in budget, quill mcp --http's token budget): only from
// them is a request taken to have reached the proxy over TLS, and to come
// from the address the proxy names. From any other peer those headers are
// ignored, as anyone can send them. The zero value trusts no peer.
type TrustedProxies []netip.Prefix

// Contains reports whether a is one of the proxies.
func (ps TrustedProxies) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// requestPeer returns the address of the connection's other end.
func requestPeer(r *http.Request) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// fromProxy reports whether r's peer is a trusted proxy.
func (ps TrustedProxies) fromProxy(r *http.Request) bool {
	if len(ps) == 0 {
		return false
	}
	a, ok := requestPeer(r)
	return ok && ps.Contains(a)
}

// Secure reports whether r reached the server over TLS: its own
// connection is TLS, or its peer is a trusted proxy whose
// X-Forwarded-Proto (the last value, which the nearest proxy set) is
// https.
func (ps TrustedProxies) Secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if !ps.fromProxy(r) {
		return false
	}
	vals := strings.Split(strings.Join(r.Header.Values("X-Forwarded-Proto"), ","), ",")
	return strings.EqualFold(strings.TrimSpace(vals[len(vals)-1]), "https")
}

// ClientAddr returns the address r comes from: its peer's, or when the
// peer is a trusted proxy, the last address of X-Forwarded-For that is not
// itself a trusted proxy (each proxy appends the address it was reached
// from, so the addresses to its left are the client's to invent). A
// malformed last entry, or none, leaves the peer's address.
func (ps TrustedProxies) ClientAddr(r *http.Request) string {
	a, ok := requestPeer(r)
	if !ok {
		return r.RemoteAddr
	}
	if !ps.Contains(a) {
		return a.String()
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop, ok := parseHop(strings.TrimSpace(hops[i]))
		if !ok {
			break
		}
		if !ps.Contains(hop) {
			return hop.String()
		}
		a = hop
	}
	return a.String()
}

// parseHop parses an X-Forwarded-For entry: an IP address, or one with a
// port as some proxies write it.
func parseHop(h string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(h); err == nil {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}
