package auth

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The regular expressions the shape checks replaced, the tokens' layout as
// SPEC and the docs give it.
var (
	tokenShape  = regexp.MustCompile(`^(qt|qo)_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$`)
	prefixShape = regexp.MustCompile(`^(qt|qo)_[0-9a-f]{8}$`)
)

func checkShapes(t *testing.T, s string) {
	t.Helper()
	for _, kind := range []string{tenantKind, operatorKind} {
		want := strings.HasPrefix(s, kind)
		require.Equal(t, want && tokenShape.MatchString(s), isToken(s, kind), "isToken(%q, %q)", s, kind)
		require.Equal(t, want && prefixShape.MatchString(s), isPrefix(s, kind), "isPrefix(%q, %q)", s, kind)
	}
}

func TestTokenShapes(t *testing.T) {
	t.Parallel()
	secret := strings.Repeat("aZ09_-", 7) + "x" // 43
	for _, s := range []string{
		"", "qt_", "qt_0123abcd", "qo_0123abcd", "qt_0123ABCD", "qt_0123abc", "qt_0123abcde", "qx_0123abcd",
		"qt_0123abcd_" + secret, "qo_0123abcd_" + secret, "qt_0123abcd-" + secret, "qt_0123abcd_" + secret[:42],
		"qt_0123abcd_" + secret + "y", "qt_0123abcd_" + secret[:42] + "=", "qt_0123abcd_" + secret[:42] + "é",
		"qt_0123abcg_" + secret, " qt_0123abcd_" + secret[1:],
	} {
		checkShapes(t, s)
	}
}

func FuzzTokenShapes(f *testing.F) {
	f.Add("qt_0123abcd_" + strings.Repeat("A", 43))
	f.Add("qo_0123abcd")
	f.Fuzz(func(t *testing.T, s string) { checkShapes(t, s) })
}
