package auth

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/idempotency"
)

// countingQuerier is the real pool, counting the token lookups it is asked
// for: the cost of a failed authentication is what these tests measure.
type countingQuerier struct {
	idempotency.Querier
	lookups atomic.Int64
}

func (c *countingQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sql == sqlTokenLookup {
		c.lookups.Add(1)
	}
	return c.Querier.QueryRow(ctx, sql, args...)
}

// randomToken is a well-formed token that was never issued.
func randomToken(t *testing.T) string {
	t.Helper()
	var raw [36]byte
	_, err := rand.Read(raw[:])
	require.NoError(t, err)
	return "qt_" + hex.EncodeToString(raw[:4]) + "_" + base64.RawURLEncoding.EncodeToString(raw[4:])
}

// clock is a settable time for the authenticator.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newCounted(t *testing.T, ttl time.Duration, lim Limits) (*Authenticator, *countingQuerier, *clock) {
	t.Helper()
	pool, _ := dbtest.Pool(t, 8)
	q := &countingQuerier{Querier: pool}
	a := NewAuthenticatorWithLimits(q, ttl, lim)
	c := &clock{t: time.Now()}
	a.now = c.now
	return a, q, c
}

func TestRepeatedBadTokenCostsOneQuery(t *testing.T) {
	t.Parallel()
	a, q, c := newCounted(t, 5*time.Second, Limits{NegativeTTL: 10 * time.Second})
	ctx := t.Context()
	bad := "Bearer " + randomToken(t)
	for range 50 {
		_, err := a.AuthenticateFrom(ctx, "192.0.2.1:5000", bad)
		require.ErrorIs(t, err, ErrUnauthenticated)
	}
	require.EqualValues(t, 1, q.lookups.Load(), "a repeated failed token is refused from the negative cache")

	// Malformed tokens never cost a query, cached or not.
	for _, h := range []string{"", "Bearer", "Bearer nope", "Basic " + randomToken(t)} {
		_, err := a.AuthenticateFrom(ctx, "192.0.2.1:5000", h)
		require.ErrorIs(t, err, ErrUnauthenticated)
	}
	require.EqualValues(t, 1, q.lookups.Load())

	// Past the negative TTL it is looked up again (and refused again).
	c.add(10 * time.Second)
	_, err := a.AuthenticateFrom(ctx, "192.0.2.1:5000", bad)
	require.ErrorIs(t, err, ErrUnauthenticated)
	require.EqualValues(t, 2, q.lookups.Load())

	// A token created after failures of others works at once: the
	// negative cache holds only the exact tokens that failed.
	tok, err := Create(ctx, q.Querier, "acme", time.Now())
	require.NoError(t, err)
	tenant, err := a.AuthenticateFrom(ctx, "192.0.2.1:5000", "Bearer "+tok)
	require.NoError(t, err)
	require.Equal(t, "acme", tenant)
}

func TestRevokedTokenIsNegativelyCachedAfterThePositiveTTL(t *testing.T) {
	t.Parallel()
	a, q, c := newCounted(t, 5*time.Second, Limits{})
	ctx := t.Context()
	tok, err := Create(ctx, q.Querier, "acme", time.Now())
	require.NoError(t, err)
	_, err = a.Authenticate(ctx, "Bearer "+tok)
	require.NoError(t, err)
	require.NoError(t, Revoke(ctx, q.Querier, tok, time.Now()))
	_, err = a.Authenticate(ctx, "Bearer "+tok)
	require.NoError(t, err, "within the positive TTL, as before")
	c.add(5 * time.Second)
	for range 10 {
		_, err = a.Authenticate(ctx, "Bearer "+tok)
		require.ErrorIs(t, err, ErrUnauthenticated)
	}
	require.EqualValues(t, 2, q.lookups.Load(), "one lookup while valid, one that found it revoked")
}

func TestFailedLookupsAreLimitedPerAddress(t *testing.T) {
	t.Parallel()
	const burst = 5
	a, q, c := newCounted(t, 5*time.Second, Limits{FailuresPerSecond: 0.5, FailureBurst: burst})
	ctx := t.Context()
	good, err := Create(ctx, q.Querier, "acme", time.Now())
	require.NoError(t, err)
	fresh, err := Create(ctx, q.Querier, "globex", time.Now())
	require.NoError(t, err)
	const attacker, other = "198.51.100.7:40000", "203.0.113.9:40000"
	_, err = a.AuthenticateFrom(ctx, attacker, "Bearer "+good) // cached, prefix known
	require.NoError(t, err)
	base := q.lookups.Load()

	for i := range burst {
		_, err := a.AuthenticateFrom(ctx, attacker, "Bearer "+randomToken(t))
		require.ErrorIs(t, err, ErrUnauthenticated, "failure %d is within the burst", i+1)
	}
	require.EqualValues(t, burst, q.lookups.Load()-base)
	for range 20 {
		_, err := a.AuthenticateFrom(ctx, attacker, "Bearer "+randomToken(t))
		var limited *RateLimitedError
		require.ErrorAs(t, err, &limited)
		require.ErrorIs(t, err, ErrRateLimited)
		require.Equal(t, 2*time.Second, limited.RetryAfter, "one token at 0.5/s")
	}
	require.EqualValues(t, burst, q.lookups.Load()-base, "a limited address costs no query")

	// Another address (another port of the same host is the same address).
	_, err = a.AuthenticateFrom(ctx, "198.51.100.7:40001", "Bearer "+randomToken(t))
	require.ErrorIs(t, err, ErrRateLimited)
	_, err = a.AuthenticateFrom(ctx, other, "Bearer "+randomToken(t))
	require.ErrorIs(t, err, ErrUnauthenticated, "other addresses are unaffected")
	tenant, err := a.AuthenticateFrom(ctx, other, "Bearer "+fresh)
	require.NoError(t, err)
	require.Equal(t, "globex", tenant)

	// The limited address: a cached valid token passes; an uncached one
	// whose prefix was never seen valid waits like the attacker.
	_, err = a.AuthenticateFrom(ctx, attacker, "Bearer "+good)
	require.NoError(t, err)
	other2, err := Create(ctx, q.Querier, "initech", time.Now())
	require.NoError(t, err)
	_, err = a.AuthenticateFrom(ctx, attacker, "Bearer "+other2)
	require.ErrorIs(t, err, ErrRateLimited)

	// When the valid token's cache entry expires, its known prefix is
	// looked up once per TTL even while the address stays limited. The
	// clock moves 5 s, so the bucket (0.5/s) regains 2.5 tokens: the
	// attacker spends them first.
	c.add(5 * time.Second)
	for range 2 {
		_, err := a.AuthenticateFrom(ctx, attacker, "Bearer "+randomToken(t))
		require.ErrorIs(t, err, ErrUnauthenticated)
	}
	_, err = a.AuthenticateFrom(ctx, attacker, "Bearer "+randomToken(t))
	require.ErrorIs(t, err, ErrRateLimited)
	tenant, err = a.AuthenticateFrom(ctx, attacker, "Bearer "+good)
	require.NoError(t, err, "a known prefix is still looked up")
	require.Equal(t, "acme", tenant)

	// The bucket refills: after Retry-After the address is served again.
	c.add(2 * time.Second)
	_, err = a.AuthenticateFrom(ctx, attacker, "Bearer "+other2)
	require.NoError(t, err, "a valid lookup gives its token back")
	_, err = a.AuthenticateFrom(ctx, attacker, "Bearer "+randomToken(t))
	require.ErrorIs(t, err, ErrUnauthenticated)
}

func TestConcurrentBadTokensCostAtMostTheBurst(t *testing.T) {
	t.Parallel()
	const burst = 5
	a, q, _ := newCounted(t, 5*time.Second, Limits{FailuresPerSecond: 0.001, FailureBurst: burst, UntrustedLookups: 64})
	ctx := t.Context()
	var wg sync.WaitGroup
	var limited atomic.Int64
	for range 64 {
		tok := randomToken(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := a.AuthenticateFrom(ctx, "192.0.2.50:1", "Bearer "+tok)
			if errors.Is(err, ErrRateLimited) {
				limited.Add(1)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, burst, q.lookups.Load(), "each lookup holds its token while it runs")
	require.EqualValues(t, 64-burst, limited.Load())
}

func TestLimitsCanBeDisabled(t *testing.T) {
	t.Parallel()
	a, q, _ := newCounted(t, 0, Limits{NegativeTTL: -1, FailuresPerSecond: -1})
	bad := "Bearer " + randomToken(t)
	for range 30 {
		_, err := a.AuthenticateFrom(t.Context(), "192.0.2.1:1", bad)
		require.ErrorIs(t, err, ErrUnauthenticated)
	}
	require.EqualValues(t, 30, q.lookups.Load())
}

func TestAddressKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"192.0.2.1:5000", "192.0.2.1"},
		{"192.0.2.1", "192.0.2.1"},
		{"[::ffff:192.0.2.1]:80", "192.0.2.1"},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:443", "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:1", "fe80::/64"},
		{"@", "@"}, // a unix socket's RemoteAddr
		{"not an address:1", "not an address"},
	} {
		require.Equal(t, tc.want, addressKey(tc.in), "%q", tc.in)
	}
}

// addressKey answers as it did when every address went through
// netip.Addr.String, before an IPv4 host was returned as it came.
func FuzzAddressKey(f *testing.F) {
	for _, s := range []string{"192.0.2.1:5000", "192.0.2.1", "010.0.0.1:1", "1.2.3.4.5", "[::ffff:192.0.2.1]:80", "[2001:db8::1]:1", "@", ""} {
		f.Add(s)
	}
	viaString := func(remoteAddr string) string {
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
		ip = ip.Unmap()
		if ip.Is6() {
			p, _ := ip.Prefix(64)
			return p.String()
		}
		return ip.String()
	}
	f.Fuzz(func(t *testing.T, remoteAddr string) {
		require.Equal(t, viaString(remoteAddr), addressKey(remoteAddr), "%q", remoteAddr)
	})
}

func TestConcurrentValidRequestsFromOneAddressAreNotLimited(t *testing.T) {
	t.Parallel()
	const burst = 5
	a, q, _ := newCounted(t, 0, Limits{FailuresPerSecond: 0.001, FailureBurst: burst, UntrustedLookups: 64})
	ctx := t.Context()
	tok, err := Create(ctx, q.Querier, "acme", time.Now())
	require.NoError(t, err)
	_, err = a.AuthenticateFrom(ctx, "192.0.2.60:1", "Bearer "+tok)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 64 {
		wg.Go(func() {
			if _, err := a.AuthenticateFrom(ctx, "192.0.2.60:1", "Bearer "+tok); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "a known token's lookups do not queue behind the failure budget")
}

func TestWrongSecretsWithAKnownPrefixPayUpFront(t *testing.T) {
	t.Parallel()
	const burst = 3
	a, q, _ := newCounted(t, 0, Limits{FailuresPerSecond: 0.001, FailureBurst: burst, UntrustedLookups: 64})
	ctx := t.Context()
	tok, err := Create(ctx, q.Querier, "acme", time.Now())
	require.NoError(t, err)
	_, err = a.AuthenticateFrom(ctx, "192.0.2.70:1", "Bearer "+tok)
	require.NoError(t, err)
	base := q.lookups.Load()
	prefix := tok[:len(tokenScheme)+8]
	limited := 0
	for range 20 {
		guess := prefix + randomToken(t)[len(prefix):]
		_, err := a.AuthenticateFrom(ctx, "192.0.2.70:1", "Bearer "+guess)
		if errors.Is(err, ErrRateLimited) {
			limited++
		}
	}
	// The burst, plus the one lookup a limited address may make for a
	// known prefix per TTL (here 1 s; the clock does not move).
	require.LessOrEqual(t, q.lookups.Load()-base, int64(burst+1))
	require.GreaterOrEqual(t, limited, 20-burst-1)
}

// Lookups of tokens not known valid run before admission, on the pool the
// writes use: from many addresses at once, each well within its own
// bucket, at most Limits.UntrustedLookups of them reach the database; the
// others are refused at once, without a query and without costing their
// address's budget. The lookups are held in the database (the table is
// locked) so that they are all in flight together.
func TestUnknownTokensFromManyAddressesHoldFewConnections(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 16)
	q := &countingQuerier{Querier: pool}
	a := NewAuthenticatorWithLimits(q, time.Second, Limits{UntrustedLookups: 3})
	ctx := t.Context()

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	const callers = 12
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			_, err := a.AuthenticateFrom(ctx, fmt.Sprintf("192.0.2.%d:4000", i+1), "Bearer "+randomToken(t))
			errs <- err
		}()
	}
	refused := 0
	for range callers - 3 {
		err := <-errs
		var limited *RateLimitedError
		require.ErrorAs(t, err, &limited, "refused at once while three lookups wait")
		require.True(t, limited.AllAddresses)
		refused++
	}
	require.Equal(t, callers-3, refused)
	require.EqualValues(t, 3, q.lookups.Load(), "three queries in flight, no more")

	require.NoError(t, tx.Rollback(ctx))
	for range 3 {
		require.ErrorIs(t, <-errs, ErrUnauthenticated)
	}
	// The refused addresses' budgets were not charged: each may look up
	// a token now.
	_, err = a.AuthenticateFrom(ctx, "192.0.2.200:4000", "Bearer "+randomToken(t))
	require.ErrorIs(t, err, ErrUnauthenticated)
}
