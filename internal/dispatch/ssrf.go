package dispatch

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"syscall"
	"time"
)

// RefusedError is why the dispatcher refused to connect to an endpoint,
// before any packet was sent: a URL that is not https, or an address that
// is not public (SSRF, SPEC §11).
type RefusedError struct {
	// Addr is the address refused ("" for a refused URL); Reason says why.
	Addr, Reason string
}

func (e *RefusedError) Error() string {
	if e.Addr == "" {
		return "refused: " + e.Reason
	}
	return fmt.Sprintf("refused to connect to %s: %s", e.Addr, e.Reason)
}

// blockedPrefix is a range the dispatcher never connects to.
type blockedPrefix struct {
	p      netip.Prefix
	reason string
}

func mustPrefixes(reason string, ps ...string) []blockedPrefix {
	out := make([]blockedPrefix, len(ps))
	for i, p := range ps {
		out[i] = blockedPrefix{netip.MustParsePrefix(p), reason}
	}
	return out
}

// blocked4 are the IPv4 ranges that are not public unicast (IANA's
// special-purpose registry).
var blocked4 = concat(
	mustPrefixes("unspecified or 'this network' (0.0.0.0/8)", "0.0.0.0/8"),
	mustPrefixes("private (RFC 1918)", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
	mustPrefixes("shared address space (CGNAT, 100.64.0.0/10)", "100.64.0.0/10"),
	mustPrefixes("loopback", "127.0.0.0/8"),
	mustPrefixes("link-local (169.254.0.0/16, cloud metadata)", "169.254.0.0/16"),
	mustPrefixes("IETF protocol assignments (192.0.0.0/24)", "192.0.0.0/24"),
	mustPrefixes("documentation (TEST-NET)", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"),
	mustPrefixes("6to4 relay anycast (192.88.99.0/24)", "192.88.99.0/24"),
	mustPrefixes("benchmarking (198.18.0.0/15)", "198.18.0.0/15"),
	mustPrefixes("multicast", "224.0.0.0/4"),
	mustPrefixes("reserved or broadcast (240.0.0.0/4)", "240.0.0.0/4"),
)

// blocked6 are the ranges within global unicast (2000::/3) that are not
// public; everything outside 2000::/3 is refused too, but for NAT64.
var blocked6 = concat(
	mustPrefixes("IETF protocol assignments, Teredo, benchmarking, ORCHID (2001::/23)", "2001::/23"),
	mustPrefixes("documentation (2001:db8::/32)", "2001:db8::/32"),
	mustPrefixes("documentation (3fff::/20)", "3fff::/20"),
)

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	global6   = netip.MustParsePrefix("2000::/3")
)

func concat(lists ...[]blockedPrefix) []blockedPrefix {
	var out []blockedPrefix
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// Blocked reports whether the dispatcher refuses to connect to a, and why:
// every address that is not public unicast — loopback, private (RFC 1918,
// IPv6 ULA), link-local (cloud metadata at 169.254.169.254, fe80::/10),
// CGNAT, unspecified, multicast, broadcast, reserved, documentation and
// benchmarking ranges — and the IPv4-mapped, IPv4-compatible, NAT64 and
// 6to4 forms of such an IPv4 address. An invalid address is blocked.
func Blocked(a netip.Addr) (reason string, blocked bool) {
	if !a.IsValid() {
		return "not an IP address", true
	}
	a = a.WithZone("")
	if a.Is4In6() {
		// ::ffff:127.0.0.1 is 127.0.0.1 on a dual-stack socket.
		r, b := Blocked(a.Unmap())
		if b {
			return "IPv4-mapped " + r, true
		}
		return "", false
	}
	if a.Is4() {
		for _, p := range blocked4 {
			if p.p.Contains(a) {
				return p.reason, true
			}
		}
		return "", false
	}
	switch {
	case a.IsUnspecified():
		return "unspecified (::)", true
	case a.IsLoopback():
		return "loopback (::1)", true
	case nat64.Contains(a):
		// The well-known NAT64 prefix reaches the IPv4 address it embeds.
		b := a.As16()
		r, bl := Blocked(netip.AddrFrom4([4]byte(b[12:16])))
		if bl {
			return "NAT64 form of " + r, true
		}
		return "", false
	case sixToFour.Contains(a):
		b := a.As16()
		r, bl := Blocked(netip.AddrFrom4([4]byte(b[2:6])))
		if bl {
			return "6to4 form of " + r, true
		}
		return "", false
	case !global6.Contains(a):
		switch {
		case netip.MustParsePrefix("fc00::/7").Contains(a):
			return "unique local (IPv6 ULA, fc00::/7)", true
		case a.IsLinkLocalUnicast():
			return "link-local (fe80::/10)", true
		case a.IsMulticast():
			return "multicast (ff00::/8)", true
		}
		return "not global unicast (outside 2000::/3)", true
	}
	for _, p := range blocked6 {
		if p.p.Contains(a) {
			return p.reason, true
		}
	}
	return "", false
}

// checkURL refuses a URL the dispatcher does not POST to: one that does not
// parse, has no host, or — unless allowPrivate — is not https.
func checkURL(raw string, allowPrivate bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &RefusedError{Reason: "the URL does not parse"}
	}
	switch {
	case u.Host == "" || u.Hostname() == "":
		return nil, &RefusedError{Reason: "the URL has no host"}
	case u.Scheme == "https":
	case u.Scheme == "http" && allowPrivate:
	default:
		return nil, &RefusedError{Reason: fmt.Sprintf("scheme %q: only https URLs are delivered to", u.Scheme)}
	}
	return u, nil
}

// control is the dialer's Control: it runs on the socket about to connect,
// with the address the name resolved to, so the check holds for the
// address actually dialled (DNS rebinding cannot pass it).
func control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Addr: address, Reason: "not an IP address and port"}
	}
	if reason, blocked := Blocked(ap.Addr()); blocked {
		return &RefusedError{Addr: address, Reason: reason}
	}
	return nil
}

// NewClient returns the HTTP client of the POSTs: no proxy, no redirect
// followed (a 3xx is the answer), connections only to public addresses
// unless allowPrivate, the system's roots plus the PEM file caFile's (when
// not empty). It returns an error for a CA file that cannot be read or holds
// no certificate.
func NewClient(allowPrivate bool, caFile string, perHost int) (*http.Client, error) {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = control
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("QUILL_WEBHOOK_TLS_CA: %w", err)
		}
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, errors.New("QUILL_WEBHOOK_TLS_CA: no PEM certificate in " + caFile)
		}
		tlsCfg.RootCAs = roots
	}
	tr := &http.Transport{
		Proxy:                  nil, // never through a proxy: the address checked is the one dialled
		DialContext:            dialer.DialContext,
		TLSClientConfig:        tlsCfg,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    perHost,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}, nil
}
