// Package auth issues, revokes and checks Quill's bearer tokens. A token maps
// to exactly one tenant; it is the only source of a request's tenant. Only the
// token's SHA-256 is stored: tokens carry 256 random bits, so a fast hash is
// enough and a stolen table reveals no usable token.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/lru"
)

// tokenScheme starts every token, so that leaked tokens are recognisable by
// secret scanners.
const tokenScheme = "qt_"

var (
	// ErrUnauthenticated: the token is malformed, unknown or revoked.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrInvalidTenant: the tenant name does not match contract.TenantPattern.
	ErrInvalidTenant = errors.New("tenant names are 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit")
	// ErrTokenNotFound: no token has this prefix.
	ErrTokenNotFound = errors.New("no token with this prefix")
)

// Token layout: qt_<8 hex: prefix>_<43 base64url: 32 random bytes>
// (qo_ for an operator's). The shapes are checked by loops, not regular
// expressions, which were 4 % of a create's CPU (issue 29);
// TestTokenShapes holds them to the expressions
// ^qt_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$ and ^qt_[0-9a-f]{8}$.
const (
	tenantKind   = "qt_"
	operatorKind = operatorScheme
	prefixLen    = 3 + 8
	tokenLen     = prefixLen + 1 + 43
)

// isPrefix reports whether s is kind followed by 8 lower-case hex digits.
func isPrefix(s, kind string) bool {
	if len(s) != prefixLen || s[:3] != kind {
		return false
	}
	for i := 3; i < prefixLen; i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// isToken reports whether s is a token of kind: its prefix, '_', and 43
// characters of base64url without padding.
func isToken(s, kind string) bool {
	if len(s) != tokenLen || !isPrefix(s[:prefixLen], kind) || s[prefixLen] != '_' {
		return false
	}
	for i := prefixLen + 1; i < tokenLen; i++ {
		switch c := s[i]; {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// PrefixOf returns the public prefix (qt_xxxxxxxx, or qo_xxxxxxxx for an
// operator token) of a token or of a prefix. It returns ErrTokenNotFound
// when s is neither.
func PrefixOf(s string) (string, error) {
	if isToken(s, tenantKind) || isToken(s, operatorKind) {
		return s[:len(tokenScheme)+8], nil
	}
	if isPrefix(s, tenantKind) || isPrefix(s, operatorKind) {
		return s, nil
	}
	return "", fmt.Errorf("%w: %q is neither a token nor a token prefix (qt_ or qo_ and 8 hex digits)", ErrTokenNotFound, s)
}

func hashToken(tok string) []byte {
	sum := sha256.Sum256([]byte(tok))
	return sum[:]
}

const (
	sqlTokenInsert = `INSERT INTO api_tokens (prefix, hash, tenant, created_at) VALUES ($1, $2, $3, $4)`
	sqlTokenRevoke = `UPDATE api_tokens SET revoked_at = coalesce(revoked_at, $2) WHERE prefix = $1`
	sqlTokenLookup = `SELECT tenant, hash FROM api_tokens WHERE prefix = $1 AND revoked_at IS NULL`
)

// Create issues a new token for tenant and returns it; it is shown once and
// never stored. Errors: ErrInvalidTenant, database errors.
func Create(ctx context.Context, q idempotency.Querier, tenant string, now time.Time) (string, error) {
	if !contract.ValidTenant(tenant) {
		return "", fmt.Errorf("%w: %q", ErrInvalidTenant, tenant)
	}
	return issue(ctx, q, tokenScheme, "token", sqlTokenInsert, tenant, now)
}

// issue makes a token of scheme — scheme, 8 hex digits of prefix, "_", 43
// base64url characters: 256 random bits in all — and stores its prefix and
// SHA-256 with insert ($1 prefix, $2 hash, $3 owner, $4 now). A prefix
// collision (1 in 4 billion) gets a new token.
func issue(ctx context.Context, q idempotency.Querier, scheme, what, insert, owner string, now time.Time) (string, error) {
	for range 3 {
		var raw [36]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return "", fmt.Errorf("random %s: %w", what, err)
		}
		prefix := scheme + hex.EncodeToString(raw[:4])
		tok := prefix + "_" + base64.RawURLEncoding.EncodeToString(raw[4:])
		_, err := q.Exec(ctx, insert, prefix, hashToken(tok), owner, now)
		if errors.Is(db.Translate(err), db.ErrConflict) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("store %s: %w", what, db.Translate(err))
		}
		return tok, nil
	}
	return "", fmt.Errorf("store %s: prefix collisions, try again", what)
}

// Revoke revokes the token with prefix (or the token itself) from now on,
// a tenant's or an operator's. Revoking twice is not an error. Errors:
// ErrTokenNotFound, database errors.
func Revoke(ctx context.Context, q idempotency.Querier, prefixOrToken string, now time.Time) error {
	prefix, err := PrefixOf(prefixOrToken)
	if err != nil {
		return err
	}
	sql, what := sqlTokenRevoke, "token"
	if strings.HasPrefix(prefix, operatorScheme) {
		sql, what = sqlOperatorRevoke, "operator token"
	}
	tag, err := q.Exec(ctx, sql, prefix, now)
	if err != nil {
		return fmt.Errorf("revoke %s: %w", what, db.Translate(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", ErrTokenNotFound, prefix)
	}
	return nil
}

// Authenticate returns the tenant of the bearer token in an Authorization
// header value. Errors: ErrUnauthenticated; a database error (wrapping
// db.ErrUnavailable when it is unreachable).
func Authenticate(ctx context.Context, q idempotency.Querier, header string) (string, error) {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || !isToken(tok, tenantKind) {
		return "", ErrUnauthenticated
	}
	var tenant string
	var stored []byte
	err := q.QueryRow(ctx, sqlTokenLookup, tok[:len(tokenScheme)+8]).Scan(&tenant, &stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrUnauthenticated
	}
	if err != nil {
		return "", fmt.Errorf("look up token: %w", db.Translate(err))
	}
	if subtle.ConstantTimeCompare(stored, hashToken(tok)) != 1 {
		return "", ErrUnauthenticated
	}
	return tenant, nil
}

// Bounds and defaults of the Authenticator's caches and limits.
const (
	// maxCached bounds the positive cache; past it the cache starts over
	// (its keys are valid tokens, which only the operator makes).
	maxCached = 10000
	// maxNegative bounds the negative cache, least recently used out: an
	// attacker chooses its keys.
	maxNegative = 10000
	// maxAddresses bounds the per-address limiters, least recently used
	// out: an evicted address only gets a fresh burst.
	maxAddresses = 10000
	// maxKnownPrefixes bounds the prefixes of tokens seen valid.
	maxKnownPrefixes = 10000

	// DefaultNegativeTTL is how long a failed token is refused without a
	// query. It can be long: a refused token never becomes valid (tokens
	// are 256 random bits made at creation, and a revoked token stays
	// revoked), so it only bounds how long an entry takes room.
	DefaultNegativeTTL = 30 * time.Second
	// DefaultFailuresPerSecond and DefaultFailureBurst are the token
	// bucket of each client address for lookups that find no valid token.
	DefaultFailuresPerSecond = 1.0
	DefaultFailureBurst      = 20
	// DefaultUntrustedLookups bounds the lookups of tokens not known
	// valid in flight at once: a lookup is one indexed query of well
	// under a millisecond, so four serve a legitimate crowd of new tokens,
	// and an attack from many addresses holds at most four of the pool's
	// connections.
	DefaultUntrustedLookups = 4
)

// ErrRateLimited is wrapped by RateLimitedError.
var ErrRateLimited = errors.New("too many failed authentications from this address")

// RateLimitedError says that the client's address has used up its budget
// of failed token lookups: the token was not looked up (nothing was
// executed), and the same request may be sent again after RetryAfter.
type RateLimitedError struct {
	// RetryAfter is when the address's budget has room for a lookup again.
	RetryAfter time.Duration
	// AllAddresses says that the lookups of all addresses together were
	// at their bound (Limits.UntrustedLookups), not this address's budget.
	AllAddresses bool
}

func (e *RateLimitedError) Error() string {
	if e.AllAddresses {
		return fmt.Sprintf("too many lookups of unknown tokens at once; retry after %s", e.RetryAfter)
	}
	return fmt.Sprintf("%v; retry after %s", ErrRateLimited, e.RetryAfter)
}

// Unwrap returns ErrRateLimited.
func (e *RateLimitedError) Unwrap() error { return ErrRateLimited }

// Limits bound what failed authentications cost the database. Zero fields
// take the defaults; a negative NegativeTTL or FailuresPerSecond disables
// that protection.
type Limits struct {
	// NegativeTTL is how long a token whose lookup failed is refused
	// without another query.
	NegativeTTL time.Duration
	// FailuresPerSecond and FailureBurst are the token bucket, per client
	// address, of lookups that find no valid token.
	FailuresPerSecond float64
	FailureBurst      int
	// UntrustedLookups is how many lookups of tokens not known valid run
	// at once, from all addresses together (default
	// DefaultUntrustedLookups): they run before admission, on the pool
	// the writes use, and many addresses each within their bucket must
	// not take it. Past it the token is not looked up: a RateLimitedError
	// with AllAddresses set.
	UntrustedLookups int
}

func (l Limits) withDefaults() Limits {
	if l.NegativeTTL == 0 {
		l.NegativeTTL = DefaultNegativeTTL
	}
	if l.FailuresPerSecond == 0 {
		l.FailuresPerSecond = DefaultFailuresPerSecond
	}
	if l.FailureBurst <= 0 {
		l.FailureBurst = DefaultFailureBurst
	}
	if l.UntrustedLookups <= 0 {
		l.UntrustedLookups = DefaultUntrustedLookups
	}
	return l
}

// Authenticator checks bearer tokens, remembering a valid token's tenant for
// a short TTL so that most requests cost no query. A revoked token is
// therefore refused within the TTL, not at once; a TTL of 0 disables that
// cache. Only hashes of tokens are kept.
//
// Failed lookups are bounded twice (decision 0042): a token that failed is
// refused without a query for Limits.NegativeTTL, and each client address
// has a token bucket of failed lookups; while it is empty, a token that
// would need a query is answered with a RateLimitedError instead, unless
// its prefix belongs to a token seen valid (looked up at most once per TTL
// then), so an attacker with endless distinct tokens costs the database at
// most the bucket's rate.
type Authenticator struct {
	q   idempotency.Querier
	ttl time.Duration
	lim Limits
	now func() time.Time

	mu       sync.Mutex
	tokens   map[[sha256.Size]byte]cached
	negative *lru.Cache[[sha256.Size]byte, time.Time] // expiry
	limiters *lru.Cache[string, *rate.Limiter]
	known    *lru.Cache[string, knownPrefix]

	flight singleflight.Group // lookups in flight, by address and token
	// untrusted holds a place per lookup of a token not known valid.
	untrusted chan struct{}
}

// knownPrefix is what is remembered of a prefix of a token seen valid.
type knownPrefix struct {
	lastLimited    time.Time // its last lookup from a limited address
	contestedUntil time.Time // a lookup with it failed: pay up front until then
}

type cached struct {
	tenant  string
	expires time.Time
}

// NewAuthenticator returns an authenticator over q (a pool) with a cache of
// ttl and the default Limits.
func NewAuthenticator(q idempotency.Querier, ttl time.Duration) *Authenticator {
	return NewAuthenticatorWithLimits(q, ttl, Limits{})
}

// NewAuthenticatorWithLimits is NewAuthenticator with lim instead of the
// default Limits.
func NewAuthenticatorWithLimits(q idempotency.Querier, ttl time.Duration, lim Limits) *Authenticator {
	return &Authenticator{q: q, ttl: ttl, lim: lim.withDefaults(), now: time.Now,
		tokens:    make(map[[sha256.Size]byte]cached),
		negative:  lru.New[[sha256.Size]byte, time.Time](maxNegative),
		limiters:  lru.New[string, *rate.Limiter](maxAddresses),
		known:     lru.New[string, knownPrefix](maxKnownPrefixes),
		untrusted: make(chan struct{}, lim.withDefaults().UntrustedLookups),
	}
}

// Limits returns the limits in force, defaults applied.
func (a *Authenticator) Limits() Limits { return a.lim }

// Authenticate returns the tenant of the bearer token in an Authorization
// header value, without a per-address limit. Errors as for
// AuthenticateFrom, but never a RateLimitedError.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (string, error) {
	return a.AuthenticateFrom(ctx, "", header)
}

// AuthenticateFrom returns the tenant of the bearer token in an
// Authorization header value sent from remoteAddr (an http.Request's
// RemoteAddr: host:port; "" for no per-address limit). Errors:
// ErrUnauthenticated; a *RateLimitedError (wrapping ErrRateLimited) when
// remoteAddr's budget of failed lookups is spent and the token would need
// a query; a database error (wrapping db.ErrUnavailable when it is
// unreachable), which is neither cached nor counted.
func (a *Authenticator) AuthenticateFrom(ctx context.Context, remoteAddr, header string) (string, error) {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || !isToken(tok, tenantKind) {
		return "", ErrUnauthenticated // costs no query, so it is not counted
	}
	prefix := tok[:len(tokenScheme)+8]
	key := sha256.Sum256([]byte(header))
	now := a.now()

	a.mu.Lock()
	if c, ok := a.tokens[key]; ok && a.ttl > 0 && now.Before(c.expires) {
		a.mu.Unlock()
		return c.tenant, nil
	}
	if exp, ok := a.negative.Get(key); ok {
		if now.Before(exp) {
			a.mu.Unlock()
			return "", ErrUnauthenticated
		}
		a.negative.Remove(key)
	}
	a.mu.Unlock()
	addr := addressKey(remoteAddr) // past the caches, which need none
	// Concurrent requests with the same token from the same address (an
	// agent's first burst after a start, or an attacker's repeats) share
	// one lookup and one charge to the bucket. The lookup runs on a context
	// of its own, bounded, so that a caller who leaves does not fail the
	// others waiting for the same answer.
	v, err, _ := a.flight.Do(addr+"\x00"+string(key[:]), func() (any, error) {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
		defer cancel()
		return a.lookup(lctx, addr, prefix, key, header)
	})
	if err != nil {
		return "", err
	}
	return v.(string), nil
}

// lookupTimeout bounds one token lookup (a pool acquire and a query): a
// full pool answers 503 rather than holding the request.
const lookupTimeout = 5 * time.Second

// lookup is AuthenticateFrom's path past the caches: the bucket of addr,
// the query, and what its answer teaches the caches.
func (a *Authenticator) lookup(ctx context.Context, addr, prefix string, key [sha256.Size]byte, header string) (string, error) {
	now := a.now()
	a.mu.Lock()
	// A lookup of a token whose prefix is not known valid (or is being
	// tried with wrong secrets) takes its token from the bucket before it
	// is made, so that concurrent requests cannot all pass a bucket with
	// one token left, and gives it back when the token is valid. A known,
	// uncontested prefix is looked up without one, so that an agent's
	// concurrent requests never queue behind the bucket.
	lim := a.limiter(addr)
	k, known := a.known.Get(prefix)
	trusted := known && !now.Before(k.contestedUntil)
	var held *rate.Reservation
	if lim != nil && !trusted {
		held = lim.ReserveN(now, 1)
		if !held.OK() || held.DelayFrom(now) > 0 {
			held.CancelAt(now)
			held = nil
			if !a.mayLookUpKnown(prefix, now) {
				err := a.limited(lim, now)
				a.mu.Unlock()
				return "", err
			}
		}
	}
	a.mu.Unlock()

	if !trusted {
		select {
		case a.untrusted <- struct{}{}:
			defer func() { <-a.untrusted }()
		default:
			if held != nil {
				a.mu.Lock()
				held.CancelAt(now) // not looked up: not the address's failure
				a.mu.Unlock()
			}
			return "", &RateLimitedError{RetryAfter: time.Second, AllAddresses: true}
		}
	}
	tenant, err := Authenticate(ctx, a.q, header)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err != nil && !errors.Is(err, ErrUnauthenticated):
		if held != nil {
			held.CancelAt(now) // a database error is not the client's failure
		}
		return "", err
	case err != nil:
		if a.lim.NegativeTTL > 0 {
			a.negative.Put(key, now.Add(a.lim.NegativeTTL))
		}
		if held == nil && lim != nil {
			lim.AllowN(now, 1) // a trusted lookup pays after failing
		}
		if k, ok := a.known.Get(prefix); ok {
			// Someone tries secrets with a valid prefix: its lookups
			// pay up front again for a while.
			k.contestedUntil = now.Add(max(a.lim.NegativeTTL, time.Second))
			a.known.Put(prefix, k)
		}
		return "", err
	}
	if held != nil {
		held.CancelAt(now)
	}
	if _, ok := a.known.Get(prefix); !ok {
		a.known.Put(prefix, knownPrefix{})
	}
	if a.ttl > 0 {
		if len(a.tokens) >= maxCached {
			clear(a.tokens)
		}
		a.tokens[key] = cached{tenant: tenant, expires: now.Add(a.ttl)}
	}
	return tenant, nil
}

// limiter returns addr's token bucket, or nil when there is no per-address
// limit. Callers hold a.mu.
func (a *Authenticator) limiter(addr string) *rate.Limiter {
	if addr == "" || a.lim.FailuresPerSecond < 0 {
		return nil
	}
	lim, ok := a.limiters.Get(addr)
	if !ok {
		lim = rate.NewLimiter(rate.Limit(a.lim.FailuresPerSecond), a.lim.FailureBurst)
		a.limiters.Put(addr, lim)
	}
	return lim
}

// mayLookUpKnown reports whether a limited address may still have a token
// with prefix looked up: only a prefix of a token seen valid, and only once
// per cache TTL (at least a second), so that an agent sharing an address
// (a NAT, a proxy) with an attacker keeps working when its cached entry
// expires, while the attacker, even knowing a prefix, costs one query per
// TTL for it. Callers hold a.mu.
func (a *Authenticator) mayLookUpKnown(prefix string, now time.Time) bool {
	k, ok := a.known.Get(prefix)
	if !ok || now.Sub(k.lastLimited) < max(a.ttl, time.Second) {
		return false
	}
	k.lastLimited = now
	a.known.Put(prefix, k)
	return true
}

// limited is the RateLimitedError of lim at now: Retry-After is when the
// bucket holds one token again, in whole seconds, at least one.
func (a *Authenticator) limited(lim *rate.Limiter, now time.Time) error {
	return limitedAt(lim, now)
}

// addressKey is the limit's key for a RemoteAddr: the IP address, or for
// IPv6 its /64 (one host usually holds a whole /64), or the value itself
// when it is not host:port with an IP host. Behind a proxy every request
// comes from the proxy's address; X-Forwarded-For is not trusted, as any
// client can send it (decision 0042).
func addressKey(remoteAddr string) string {
	if remoteAddr == "" {
		return ""
	}
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip.Is4() {
		return host // ParseAddr takes only the canonical dotted form: host is ip.String()
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
