package auth_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
)

func TestPrefixOf(t *testing.T) {
	t.Parallel()
	const (
		prefix = "qt_0123abcd"
		secret = "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCd" // 42
	)
	token := prefix + "_" + secret + "e" // 43 base64url characters
	require.Len(t, token, len(prefix)+1+43)
	tests := []struct {
		name string
		in   string
		want string // "" means ErrTokenNotFound
	}{
		{name: "token", in: token, want: prefix},
		{name: "token with - and _ in secret", in: prefix + "_" + strings.Repeat("-_", 21) + "A", want: prefix},
		{name: "prefix", in: prefix, want: prefix},
		{name: "other prefix", in: "qt_ffffffff", want: "qt_ffffffff"},
		{name: "operator token", in: "qo_0123abcd_" + secret + "e", want: "qo_0123abcd"},
		{name: "operator prefix", in: "qo_0123abcd", want: "qo_0123abcd"},

		{name: "empty", in: ""},
		{name: "scheme only", in: "qt_"},
		{name: "prefix with trailing underscore", in: prefix + "_"},
		{name: "uppercase hex in prefix", in: "qt_0123ABCD"},
		{name: "short prefix", in: "qt_0123abc"},
		{name: "long prefix", in: "qt_0123abcde"},
		{name: "non-hex prefix", in: "qt_0123abcg"},
		{name: "other scheme", in: "qx_0123abcd"},
		{name: "uppercase scheme", in: "QT_0123abcd"},
		{name: "secret too short", in: prefix + "_" + secret},
		{name: "secret too long", in: token + "f"},
		{name: "standard base64 in secret", in: prefix + "_" + secret[:41] + "+/"},
		{name: "padding in secret", in: prefix + "_" + secret + "="},
		{name: "bearer header value", in: "Bearer " + token},
		{name: "token with newline", in: token + "\n"},
		{name: "prefix with newline", in: prefix + "\n"},
		{name: "token with space", in: " " + token},
		{name: "garbage", in: "not a token"},
		{name: "prefix of prefix", in: "qt_0123"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := auth.PrefixOf(tt.in)
			if tt.want == "" {
				require.ErrorIs(t, err, auth.ErrTokenNotFound)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			// A prefix is its own prefix.
			again, err := auth.PrefixOf(got)
			require.NoError(t, err)
			require.Equal(t, got, again)
		})
	}
}
