package mcpserver

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"golang.org/x/time/rate"

	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/lru"
)

// What the HTTP server defends against hostile callers (decision 0067):
// browser pages of other origins (DNS rebinding), and bogus bearer tokens,
// which would otherwise each cost one of the API's failed authentications
// for this host's address.

// Defaults of AuthLimits. Together they stay below the API's budget of
// failed authentications per address (20 at once, 1 a second; decision
// 0042), so that the checks of this server alone never make the API limit
// its address, and one caller's address takes a third of the server's
// budget at most.
const (
	// DefaultNegativeTTL is how long a token the API refused is refused
	// again without asking it: a refused token never becomes valid.
	DefaultNegativeTTL = 30 * time.Second
	// DefaultAddressFailureBurst and DefaultAddressFailureEvery are the
	// token bucket of each client address for tokens the API refuses.
	DefaultAddressFailureBurst = 5
	DefaultAddressFailureEvery = 10 * time.Second
	// DefaultFailureBurst and DefaultFailureEvery are the server's bucket
	// for all addresses together.
	DefaultFailureBurst = 15
	DefaultFailureEvery = 2 * time.Second
)

// Bounds of the maps keyed by what a caller chooses (tokens, addresses).
const (
	maxNegative  = 10000
	maxAddresses = 10000
)

// AuthLimits bound what the bearer tokens of callers cost the API. A token
// that is not of the form of the API's tokens is refused without asking
// it. A check of a new token takes one from its address's bucket and one
// from the server's before it is sent, and gives both back when the API
// accepts the token; while either is empty, a new session with a token not
// yet accepted is answered 429 with Retry-After. Zero fields take the
// defaults; a negative NegativeTTL or AddressFailureEvery disables that
// protection (for tests).
type AuthLimits struct {
	// NegativeTTL is how long a token the API refused is refused locally.
	// Default DefaultNegativeTTL.
	NegativeTTL time.Duration
	// AddressFailureBurst and AddressFailureEvery: each client address may
	// have this many refused tokens at once, then one more per
	// AddressFailureEvery. Defaults DefaultAddressFailureBurst and
	// DefaultAddressFailureEvery.
	AddressFailureBurst int
	AddressFailureEvery time.Duration
	// FailureBurst and FailureEvery: the same for the whole server.
	// Defaults DefaultFailureBurst and DefaultFailureEvery.
	FailureBurst int
	FailureEvery time.Duration
}

func (l AuthLimits) withDefaults() AuthLimits {
	if l.NegativeTTL == 0 {
		l.NegativeTTL = DefaultNegativeTTL
	}
	if l.AddressFailureBurst <= 0 {
		l.AddressFailureBurst = DefaultAddressFailureBurst
	}
	if l.AddressFailureEvery == 0 {
		l.AddressFailureEvery = DefaultAddressFailureEvery
	}
	if l.FailureBurst <= 0 {
		l.FailureBurst = DefaultFailureBurst
	}
	if l.FailureEvery == 0 {
		l.FailureEvery = DefaultFailureEvery
	}
	return l
}

// tokenForm is the form of the API's tenant tokens (qt_<8 hex>_<43
// base64url>, docs/operations.md): anything else cannot be accepted, so it
// is refused without a request to the API. internal/auth owns the form; a
// test checks that a token it makes has it.
var tokenForm = regexp.MustCompile(`^qt_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$`)

// gate keeps the negative cache and the buckets of the token checks.
type gate struct {
	lim AuthLimits
	now func() time.Time

	mu        sync.Mutex
	negative  *lru.Cache[[sha256.Size]byte, time.Time] // by token digest: expiry
	addresses *lru.Cache[string, *rate.Limiter]
	all       *rate.Limiter
}

func newGate(lim AuthLimits) *gate {
	lim = lim.withDefaults()
	g := &gate{lim: lim, now: time.Now,
		negative:  lru.New[[sha256.Size]byte, time.Time](maxNegative),
		addresses: lru.New[string, *rate.Limiter](maxAddresses)}
	if lim.AddressFailureEvery > 0 {
		g.all = rate.NewLimiter(rate.Every(lim.FailureEvery), lim.FailureBurst)
	}
	return g
}

// refused reports whether token was refused by the API within NegativeTTL.
func (g *gate) refused(token string) bool {
	key := sha256.Sum256([]byte(token))
	g.mu.Lock()
	defer g.mu.Unlock()
	exp, ok := g.negative.Get(key)
	if ok && g.now().Before(exp) {
		return true
	}
	if ok {
		g.negative.Remove(key)
	}
	return false
}

// remember notes that the API refused token.
func (g *gate) remember(token string) {
	if g.lim.NegativeTTL <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.negative.Put(sha256.Sum256([]byte(token)), g.now().Add(g.lim.NegativeTTL))
}

// admission is one token check's hold on the buckets.
type admission struct {
	g    *gate
	held []*rate.Reservation
	at   time.Time
}

// admit takes a token from addr's bucket and from the server's for one
// check of a new token. When either is empty it takes none and returns how
// long until both may have one again.
func (g *gate) admit(addr string) (*admission, time.Duration) {
	a := &admission{g: g, at: g.now()}
	if g.all == nil {
		return a, 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	lim, ok := g.addresses.Get(addr)
	if !ok {
		lim = rate.NewLimiter(rate.Every(g.lim.AddressFailureEvery), g.lim.AddressFailureBurst)
		g.addresses.Put(addr, lim)
	}
	var wait time.Duration
	for _, l := range []*rate.Limiter{lim, g.all} {
		r := l.ReserveN(a.at, 1)
		if d := r.DelayFrom(a.at); !r.OK() || d > 0 {
			wait = max(wait, d, time.Second)
			r.CancelAt(a.at)
			continue
		}
		a.held = append(a.held, r)
	}
	if wait > 0 {
		for _, r := range a.held {
			r.CancelAt(a.at)
		}
		return nil, max(time.Second, wait.Round(time.Second))
	}
	return a, 0
}

// release gives the tokens back: the check did not fail the caller (the
// API accepted the token, or could not say).
func (a *admission) release() {
	a.g.mu.Lock()
	defer a.g.mu.Unlock()
	for _, r := range a.held {
		r.CancelAt(a.at)
	}
}

// clientAddress is the budget's key for a request: the connection's IP
// address, for IPv6 its /64 (one host usually holds a whole /64). When the
// connection comes from a trusted proxy it is the last X-Forwarded-For
// hop that is not itself one (each proxy appends the address it was
// reached from; those to its left are the caller's to invent); from any
// other peer X-Forwarded-For is not read.
func clientAddress(r *http.Request, trusted httpserve.TrustedProxies) string {
	c := trusted.ClientAddr(r)
	if a, err := netip.ParseAddr(c); err == nil && a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return c
}

// origins decides which Origin headers are accepted: the server's own
// (http://ADDR of the address it listens on; for a loopback address also
// http://localhost:PORT, http://127.0.0.1:PORT and http://[::1]:PORT) and
// those configured. The Host header is not consulted: under DNS rebinding
// it names the attacker's domain, as the Origin does.
type origins map[string]bool

// newOrigins returns the accepted origins of a server listening on addr,
// with allowed. It returns an error naming an allowed origin that is not
// scheme://host[:port].
func newOrigins(addr net.Addr, allowed []string) (origins, error) {
	o := origins{}
	for _, a := range allowed {
		n, ok := normalOrigin(a)
		if !ok {
			return nil, fmt.Errorf("allowed origin %q: want scheme://host[:port], such as https://agent.example.com", a)
		}
		o[n] = true
	}
	if tcp, ok := addr.(*net.TCPAddr); ok {
		port := strconv.Itoa(tcp.Port)
		switch {
		case tcp.IP.IsLoopback():
			for _, h := range []string{"localhost", "127.0.0.1", "[::1]"} {
				o["http://"+h+":"+port] = true
			}
		case !tcp.IP.IsUnspecified():
			o["http://"+net.JoinHostPort(tcp.IP.String(), port)] = true
		}
	}
	return o, nil
}

// ParseAllowedOrigins reads a comma-separated list of origins
// (scheme://host[:port], http or https; spaces around each are ignored)
// for HTTPConfig.AllowedOrigins. It returns an error naming the first that
// is not an origin.
func ParseAllowedOrigins(list string) ([]string, error) {
	var out []string
	for _, o := range strings.Split(list, ",") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		n, ok := normalOrigin(o)
		if !ok {
			return nil, fmt.Errorf("origin %q: want scheme://host[:port], such as https://agent.example.com", o)
		}
		out = append(out, n)
	}
	return out, nil
}

// normalOrigin returns origin in the form a browser sends it (lower-case
// scheme and host, no default port, no path), and whether it is one.
func normalOrigin(origin string) (string, bool) {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host, true
}

// check refuses, with 403, a request whose Origin is not accepted; a
// request without one (a program, not a browser page) passes.
func (o origins) check(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if vs := r.Header.Values("Origin"); len(vs) > 0 {
			n, ok := normalOrigin(vs[0])
			if len(vs) > 1 || !ok || !o[n] {
				refuse(w, http.StatusForbidden, fmt.Sprintf("Origin %q may not use this MCP server (quill mcp --allowed-origins)", vs[0]))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// refuse answers a request this server turns away before the MCP handler
// sees it: the HTTP status, and a JSON-RPC error the SDK's client
// surfaces to its caller.
func refuse(w http.ResponseWriter, status int, msg string) {
	b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: msg}})
	if err != nil {
		http.Error(w, msg, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
