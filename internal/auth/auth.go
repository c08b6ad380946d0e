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
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
)

// tokenScheme starts every token, so that leaked tokens are recognisable by
// secret scanners.
const tokenScheme = "qt_"

var (
	// ErrUnauthenticated: the token is malformed, unknown or revoked.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrInvalidTenant: the tenant name does not match ^[a-z0-9][a-z0-9-]{0,62}$.
	ErrInvalidTenant = errors.New("tenant names are 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit")
	// ErrTokenNotFound: no token has this prefix.
	ErrTokenNotFound = errors.New("no token with this prefix")
)

var tenantRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidTenant reports whether name is a valid tenant name; tenant names are
// NATS subject tokens, so the set is narrow.
func ValidTenant(name string) bool { return tenantRE.MatchString(name) }

// Token layout: qt_<8 hex: prefix>_<43 base64url: 32 random bytes>.
var (
	tokenRE  = regexp.MustCompile(`^qt_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$`)
	prefixRE = regexp.MustCompile(`^qt_[0-9a-f]{8}$`)
)

// PrefixOf returns the public prefix (qt_xxxxxxxx) of a token or of a prefix.
// It returns ErrTokenNotFound when s is neither.
func PrefixOf(s string) (string, error) {
	if tokenRE.MatchString(s) {
		return s[:len(tokenScheme)+8], nil
	}
	if prefixRE.MatchString(s) {
		return s, nil
	}
	return "", fmt.Errorf("%w: %q is neither a token nor a token prefix (qt_ and 8 hex digits)", ErrTokenNotFound, s)
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
	if !ValidTenant(tenant) {
		return "", fmt.Errorf("%w: %q", ErrInvalidTenant, tenant)
	}
	for range 3 { // a prefix collision (1 in 4 billion) gets a new token
		var raw [36]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return "", fmt.Errorf("random token: %w", err)
		}
		prefix := tokenScheme + hex.EncodeToString(raw[:4])
		tok := prefix + "_" + base64.RawURLEncoding.EncodeToString(raw[4:])
		_, err := q.Exec(ctx, sqlTokenInsert, prefix, hashToken(tok), tenant, now)
		if errors.Is(db.Translate(err), db.ErrConflict) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("store token: %w", db.Translate(err))
		}
		return tok, nil
	}
	return "", errors.New("store token: prefix collisions, try again")
}

// Revoke revokes the token with prefix (or the token itself) from now on.
// Revoking twice is not an error. Errors: ErrTokenNotFound, database errors.
func Revoke(ctx context.Context, q idempotency.Querier, prefixOrToken string, now time.Time) error {
	prefix, err := PrefixOf(prefixOrToken)
	if err != nil {
		return err
	}
	tag, err := q.Exec(ctx, sqlTokenRevoke, prefix, now)
	if err != nil {
		return fmt.Errorf("revoke token: %w", db.Translate(err))
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
	if !ok || !strings.EqualFold(scheme, "Bearer") || !tokenRE.MatchString(tok) {
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

// maxCached bounds the token cache; past it the cache starts over.
const maxCached = 10000

// Authenticator checks bearer tokens, remembering a valid token's tenant for
// a short TTL so that most requests cost no query. A revoked token is
// therefore refused within the TTL, not at once; a TTL of 0 disables the
// cache. Only valid tokens are cached, by hash.
type Authenticator struct {
	q   idempotency.Querier
	ttl time.Duration
	now func() time.Time

	mu     sync.Mutex
	tokens map[[sha256.Size]byte]cached
}

type cached struct {
	tenant  string
	expires time.Time
}

// NewAuthenticator returns an authenticator over q (a pool) with a cache of
// ttl.
func NewAuthenticator(q idempotency.Querier, ttl time.Duration) *Authenticator {
	return &Authenticator{q: q, ttl: ttl, now: time.Now, tokens: make(map[[sha256.Size]byte]cached)}
}

// Authenticate returns the tenant of the bearer token in an Authorization
// header value. Errors as for the package-level Authenticate.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (string, error) {
	if a.ttl <= 0 {
		return Authenticate(ctx, a.q, header)
	}
	key := sha256.Sum256([]byte(header))
	now := a.now()
	a.mu.Lock()
	c, ok := a.tokens[key]
	a.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.tenant, nil
	}
	tenant, err := Authenticate(ctx, a.q, header)
	if err != nil {
		return "", err
	}
	a.mu.Lock()
	if len(a.tokens) >= maxCached {
		clear(a.tokens)
	}
	a.tokens[key] = cached{tenant: tenant, expires: now.Add(a.ttl)}
	a.mu.Unlock()
	return tenant, nil
}
