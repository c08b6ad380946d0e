package auth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/dbtest"
)

func TestValidOperatorName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ok   bool
	}{
		{"alice", true},
		{"Alice.Smith@ops", true},
		{"on-call_2", true},
		{strings.Repeat("a", 63), true},

		{"", false},
		{strings.Repeat("a", 64), false},
		{"-alice", false},
		{"alice smith", false},
		{"alice\n", false},
		{"<script>", false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.ok, auth.ValidOperatorName(tt.name), "%q", tt.name)
	}
}

// TestOperatorTokens: an operator token authenticates as its operator
// until revoked; a tenant token is refused by name, and neither kind passes
// where the other belongs.
func TestOperatorTokens(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 4)
	ctx := t.Context()

	_, err := auth.CreateOperator(ctx, pool, "bad name", time.Now())
	require.ErrorIs(t, err, auth.ErrInvalidOperatorName)

	tok, err := auth.CreateOperator(ctx, pool, "alice", time.Now())
	require.NoError(t, err)
	require.True(t, auth.IsOperatorToken(tok), tok)
	op, err := auth.AuthenticateOperator(ctx, pool, tok)
	require.NoError(t, err)
	require.Equal(t, auth.Operator{Prefix: tok[:11], Name: "alice"}, op)
	ok, err := auth.OperatorValid(ctx, pool, op.Prefix)
	require.NoError(t, err)
	require.True(t, ok)

	// The operator token is no tenant token: the API refuses it.
	_, err = auth.Authenticate(ctx, pool, "Bearer "+tok)
	require.ErrorIs(t, err, auth.ErrUnauthenticated)

	tenantTok, err := auth.Create(ctx, pool, "acme", time.Now())
	require.NoError(t, err)
	_, err = auth.AuthenticateOperator(ctx, pool, tenantTok)
	require.ErrorIs(t, err, auth.ErrTenantToken)

	// A forged secret behind a real prefix, and garbage, are refused.
	forged := tok[:12] + strings.Repeat("A", 43)
	_, err = auth.AuthenticateOperator(ctx, pool, forged)
	require.ErrorIs(t, err, auth.ErrUnauthenticated)
	_, err = auth.AuthenticateOperator(ctx, pool, "nope")
	require.ErrorIs(t, err, auth.ErrUnauthenticated)

	require.NoError(t, auth.Revoke(ctx, pool, op.Prefix, time.Now()))
	_, err = auth.AuthenticateOperator(ctx, pool, tok)
	require.ErrorIs(t, err, auth.ErrUnauthenticated)
	ok, err = auth.OperatorValid(ctx, pool, op.Prefix)
	require.NoError(t, err)
	require.False(t, ok)
	require.ErrorIs(t, auth.Revoke(ctx, pool, "qo_00000000", time.Now()), auth.ErrTokenNotFound)
}
