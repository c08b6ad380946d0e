package idempotency_test

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/idempotency"
)

// The digests of recorded operations are compared with new requests for as
// long as keys are remembered (720h by default): a change in the canonical
// form — an encoder upgrade that escapes differently, a reordered member —
// would turn every retry of an older operation into a 422. These digests are
// pinned; change them only together with the action's version.
func TestFingerprintDigestsArePinned(t *testing.T) {
	t.Parallel()
	cases := []struct {
		action string
		params idempotency.Params
		want   string
	}{
		{"create-note", idempotency.Params{"title": "Example note", "body": "", "attachment": nil}, "20dcd513cdb1376c979124b05948083e7a99e5758b67db64c55e873367b22062"},
		{"create-note", idempotency.Params{"title": "<é & \"q\">\u2028", "body": "line\nnext\t", "attachment": map[string]any{
			"filename": "a.txt", "content_type": "text/plain", "size": 6,
			"sha256": "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"}}, "a7501b9c4b9bb262b0d186aa0bd8d2787598aaaf46ca4e80bdea0df9d4e5d426"},
		{"delete-note", idempotency.Params{"id": "01a229cf-df18-7236-a349-3735bd4a95ce"}, "f048ec7d3ccc2889b78ba8119c1b782eee92710ea43ddbb02240383af52a2ba1"},
	}
	for _, tc := range cases {
		fp, err := idempotency.NewFingerprint(tc.action, 1, tc.params)
		require.NoError(t, err)
		doc, err := idempotency.CanonicalJSON(tc.action, 1, tc.params)
		require.NoError(t, err)
		require.Equal(t, tc.want, hex.EncodeToString(fp.Sum), "canonical form changed: %s", doc)
	}
}
