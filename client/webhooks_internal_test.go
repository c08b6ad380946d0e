package client

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// What the journal keeps of an answer: a webhook secret is null, as the
// lookup shows it; everything else, and any body without a secret member,
// as it came.
func TestWithoutSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"create", `{"id":"e","secret":"whsec_abc","url":"https://x"}`, `{"id":"e","secret":null,"url":"https://x"}`},
		{"rotation", `{"id":"e","secret":"whsec_abc","previous_secret_expires_at":"2026-12-04T00:00:00Z"}`,
			`{"id":"e","secret":null,"previous_secret_expires_at":"2026-12-04T00:00:00Z"}`},
		{"secret already null", `{"id":"e","secret":null}`, `{"id":"e","secret":null}`},
		{"no secret member", `{"id":"e","deleted_at":"2026-12-04T00:00:00Z"}`, `{"id":"e","deleted_at":"2026-12-04T00:00:00Z"}`},
		{"nested secret is not the answer's", `{"id":"e","x":{"secret":"s"}}`, `{"id":"e","x":{"secret":"s"}}`},
		{"not an object", `["whsec_abc"]`, `["whsec_abc"]`},
		{"not JSON", `oops`, `oops`},
	} {
		got := withoutSecret([]byte(tc.in))
		if tc.name == "not JSON" {
			require.Equal(t, tc.want, string(got), tc.name)
			continue
		}
		require.JSONEq(t, tc.want, string(got), tc.name)
	}
}

// Only a webhook create's or rotation's success body loses its secret in
// the journal; a note's is kept whole, a "secret" member included.
func TestJournalledBody(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"n","secret":"kept"}`)
	require.JSONEq(t, `{"id":"n","secret":"kept"}`, string(request{}.journalled(body)))
	require.JSONEq(t, `{"id":"n","secret":null}`, string(request{secret: true}.journalled(body)))
}
