package auth

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
)

func TestAuthenticatorCachesValidTokensForTTL(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 4)
	ctx := t.Context()
	tok, err := Create(ctx, pool, "acme", time.Now())
	require.NoError(t, err)
	now := time.Now()
	a := NewAuthenticator(pool, 5*time.Second)
	a.now = func() time.Time { return now }

	tenant, err := a.Authenticate(ctx, "Bearer "+tok)
	require.NoError(t, err)
	require.Equal(t, "acme", tenant)
	require.NoError(t, Revoke(ctx, pool, tok, time.Now()))

	tenant, err = a.Authenticate(ctx, "Bearer "+tok)
	require.NoError(t, err, "within the TTL the cached tenant answers")
	require.Equal(t, "acme", tenant)

	now = now.Add(5 * time.Second)
	_, err = a.Authenticate(ctx, "Bearer "+tok)
	require.ErrorIs(t, err, ErrUnauthenticated, "after the TTL the revocation holds")

	// Malformed tokens are refused without a lookup; TTL 0 asks every
	// time for a valid token (failed ones: limits_test.go).
	_, err = a.Authenticate(ctx, "Bearer nope")
	require.ErrorIs(t, err, ErrUnauthenticated)
	tok2, err := Create(ctx, pool, "globex", time.Now())
	require.NoError(t, err)
	uncached := NewAuthenticator(pool, 0)
	_, err = uncached.Authenticate(ctx, "Bearer "+tok2)
	require.NoError(t, err)
	require.NoError(t, Revoke(ctx, pool, tok2, time.Now()))
	_, err = uncached.Authenticate(ctx, "Bearer "+tok2)
	require.ErrorIs(t, err, ErrUnauthenticated)
}
