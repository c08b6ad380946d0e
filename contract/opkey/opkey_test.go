package opkey_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract/opkey"
)

// keyChars is every character a key may contain: 0x21–0x7E except '"' and ','.
func keyChars() string {
	var b strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		if c != '"' && c != ',' {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// validKey is the SPEC §3 key syntax, written independently of the code
// under test.
func validKey(k string) bool {
	if len(k) < 1 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x21 || c > 0x7e || c == '"' || c == ',' {
			return false
		}
	}
	return true
}

// sfString is the RFC 8941 sf-string form of k.
func sfString(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

func TestParse(t *testing.T) {
	t.Parallel()
	all := keyChars()
	tests := []struct {
		name string
		in   string
		want string // "" means the key is invalid
	}{
		{name: "bare", in: "abc", want: "abc"},
		{name: "quoted", in: `"abc"`, want: "abc"},
		{name: "uuid", in: "0190b6c4-5a3e-7b6f-8d2c-1e9a4f3b2c1d", want: "0190b6c4-5a3e-7b6f-8d2c-1e9a4f3b2c1d"},
		{name: "one char", in: "x", want: "x"},
		{name: "quoted one char", in: `"x"`, want: "x"},
		{name: "every allowed char bare", in: all, want: all},
		{name: "every allowed char quoted", in: sfString(all), want: all},
		{name: "backslash bare", in: `a\b`, want: `a\b`},
		{name: "escaped backslash quoted", in: `"a\\b"`, want: `a\b`},
		{name: "trailing quote bare", in: `abc"`},
		{name: "max length bare", in: strings.Repeat("k", 255), want: strings.Repeat("k", 255)},
		{name: "max length quoted", in: `"` + strings.Repeat("k", 255) + `"`, want: strings.Repeat("k", 255)},
		{name: "max length counted after unescaping", in: `"` + strings.Repeat("k", 254) + `\\"`, want: strings.Repeat("k", 254) + `\`},
		{name: "too long bare", in: strings.Repeat("k", 256)},
		{name: "too long quoted", in: `"` + strings.Repeat("k", 256) + `"`},
		{name: "too long after unescaping", in: `"` + strings.Repeat("k", 255) + `\\"`},

		{name: "empty", in: ""},
		{name: "empty quoted", in: `""`},
		{name: "lone quote", in: `"`},
		{name: "unterminated quote", in: `"abc`},
		{name: "list", in: "a, b"},
		{name: "list without space", in: "a,b"},
		{name: "list of strings", in: `"a", "b"`},
		{name: "comma inside quotes", in: `"a,b"`},
		{name: "data after closing quote", in: `"a"b`},
		{name: "space after closing quote", in: `"a" `},
		{name: "parameter after string", in: `"a";p=1`},
		{name: "leading space", in: " abc"},
		{name: "trailing space", in: "abc "},
		{name: "inner space", in: "a b"},
		{name: "space inside quotes", in: `"a b"`},
		{name: "only space", in: " "},
		{name: "tab", in: "a\tb"},
		{name: "newline", in: "a\nb"},
		{name: "NUL", in: "a\x00b"},
		{name: "DEL", in: "a\x7fb"},
		{name: "control byte quoted", in: "\"a\x01b\""},
		{name: "non-ASCII", in: "clé"},
		{name: "non-ASCII quoted", in: `"clé"`},
		{name: "emoji", in: "key-😀"},
		{name: "invalid UTF-8", in: "a\xffb"},
		{name: "escaped quote decodes to a forbidden char", in: `"a\"b"`},
		{name: "bad escape", in: `"a\b"`},
		{name: "escape at end", in: `"abc\`},
		{name: "escaped closing quote", in: `"abc\"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := opkey.Parse(tt.in)
			if tt.want == "" {
				require.Error(t, err)
				require.ErrorIs(t, err, opkey.ErrInvalid)
				require.NotErrorIs(t, err, opkey.ErrMissing)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)

			// ParseHeader with one value agrees with Parse.
			got, err = opkey.ParseHeader([]string{tt.in})
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseBareAndQuotedNameTheSameKey(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"a", "abc", `a\b`, `\`, `\\`, keyChars(), strings.Repeat("z", 255)} {
		bare, err := opkey.Parse(k)
		require.NoError(t, err, "bare %q", k)
		quoted, err := opkey.Parse(sfString(k))
		require.NoError(t, err, "quoted %q", sfString(k))
		require.Equal(t, bare, quoted)
		require.Equal(t, k, bare)
	}
}

func TestParseHeader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		values  []string
		want    string
		wantErr error
	}{
		{name: "absent (nil)", values: nil, wantErr: opkey.ErrMissing},
		{name: "absent (empty slice)", values: []string{}, wantErr: opkey.ErrMissing},
		{name: "one bare", values: []string{"abc"}, want: "abc"},
		{name: "one quoted", values: []string{`"abc"`}, want: "abc"},
		{name: "empty value", values: []string{""}, wantErr: opkey.ErrInvalid},
		{name: "list in one line", values: []string{"a, b"}, wantErr: opkey.ErrInvalid},
		{name: "repeated header", values: []string{"a", "b"}, wantErr: opkey.ErrInvalid},
		{name: "repeated header with the same value", values: []string{"a", "a"}, wantErr: opkey.ErrInvalid},
		{name: "repeated header bare and quoted", values: []string{"a", `"a"`}, wantErr: opkey.ErrInvalid},
		{name: "malformed", values: []string{"a b"}, wantErr: opkey.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := opkey.ParseHeader(tt.values)
			if tt.wantErr == nil {
				require.NoError(t, err)
				require.Equal(t, tt.want, got)
				return
			}
			require.ErrorIs(t, err, tt.wantErr)
			require.Empty(t, got)
			// Missing and invalid are different answers (two codes).
			for _, other := range []error{opkey.ErrMissing, opkey.ErrInvalid} {
				if other != tt.wantErr {
					require.False(t, errors.Is(err, other), "%v must not also be %v", err, other)
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "abc", `"abc"`, `""`, `"`, "a, b", `"a", "b"`, `"a\"b"`, `"a\\b"`, `a\b`,
		`"a\b"`, `"abc\`, " abc", "a\x00", "clé", "\xff", keyChars(), sfString(keyChars()),
		strings.Repeat("k", 255), strings.Repeat("k", 256), `"` + strings.Repeat("k", 254) + `\\"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := opkey.Parse(v)

		hk, herr := opkey.ParseHeader([]string{v})
		require.Equal(t, k, hk, "ParseHeader with one value must agree with Parse")
		require.Equal(t, err == nil, herr == nil)

		if err != nil {
			require.ErrorIs(t, err, opkey.ErrInvalid)
			require.Empty(t, k)
		} else {
			require.True(t, validKey(k), "accepted key %q (from %q) breaks the key syntax", k, v)
			// The quoted form of an accepted key names the same key.
			q, err := opkey.Parse(sfString(k))
			require.NoError(t, err, "quoted form %q of accepted key %q", sfString(k), k)
			require.Equal(t, k, q)
		}

		// A value not starting with '"' is a bare key: accepted exactly when it
		// satisfies the syntax, and then it is the key itself.
		if v == "" || v[0] != '"' {
			require.Equal(t, validKey(v), err == nil, "bare %q", v)
			if err == nil {
				require.Equal(t, v, k)
				q, err := opkey.Parse(sfString(v))
				require.NoError(t, err, "bare key %q accepted but its quoted form %q is not", v, sfString(v))
				require.Equal(t, k, q)
			}
		}
	})
}

// Hash is the first six bytes of SHA-256 over tenant, NUL and key, in hex:
// log lines written before and after it changed correlate (the values
// were computed outside Go), whatever the lengths.
func TestHash(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ tenant, key, want string }{
		{"acme", "note-42", "ab8f932456d5"},
		{"", "", "6e340b9cffb3"},
		{strings.Repeat("t", 64), strings.Repeat("k", opkey.MaxLen), "5705da0caee4"},
		{strings.Repeat("t", 200), "k", "a9b1c21d7970"}, // past the stack buffer
	} {
		require.Equal(t, c.want, opkey.Hash(c.tenant, c.key), "%.8q… %.8q…", c.tenant, c.key)
	}
}
