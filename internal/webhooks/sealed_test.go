package webhooks

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/whsecret"
)

func testKeys(t *testing.T) *whsecret.Keys {
	t.Helper()
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	keys, err := whsecret.ParseKeys(base64.StdEncoding.EncodeToString(k))
	require.NoError(t, err)
	return keys
}

// A recorded body holds the sealed secret only; opening it gives the
// secret in that member and changes nothing else, the lookup's form has
// null there, and a body without a sealed secret (a refusal) is kept.
func TestRecordedBodyKeepsTheSecretSealed(t *testing.T) {
	t.Parallel()
	keys := testKeys(t)
	s := &Service{keys: keys}
	secret, err := whsecret.NewSecret()
	require.NoError(t, err)
	const id = "0193a3f2-0000-7000-8000-000000000001"
	sealed, err := keys.Seal(secret, "acme", id)
	require.NoError(t, err)
	recorded, err := json.Marshal(Created{ID: id, URL: "https://example.com", EventTypes: []string{"quill.note.created.v1"},
		CreatedAt: "2026-12-02T00:00:00Z", Secret: sealedMarker(sealed), State: StateActive})
	require.NoError(t, err)
	require.NotContains(t, string(recorded), secret)
	require.NotContains(t, string(recorded), strings.TrimPrefix(secret, whsecret.Prefix))

	opened, err := s.open("acme", recorded)
	require.NoError(t, err)
	want, err := json.Marshal(Created{ID: id, URL: "https://example.com", EventTypes: []string{"quill.note.created.v1"},
		CreatedAt: "2026-12-02T00:00:00Z", Secret: secret, State: StateActive})
	require.NoError(t, err)
	require.Equal(t, string(want), string(opened))
	again, err := s.open("acme", recorded)
	require.NoError(t, err)
	require.Equal(t, opened, again, "every replay is the same bytes")

	// Bound to the tenant: another tenant's record does not open.
	_, err = s.open("globex", recorded)
	require.ErrorIs(t, err, whsecret.ErrOpen)
	// Another key does not open it either.
	_, err = (&Service{keys: testKeys(t)}).open("acme", recorded)
	require.ErrorIs(t, err, whsecret.ErrOpen)

	require.Contains(t, string(RedactRecorded(recorded)), `"secret":null`)
	require.NotContains(t, string(RedactRecorded(recorded)), sealedPrefix)

	problem := []byte(`{"type":"urn:quill:problem:not_found","status":404,"code":"not_found"}`)
	out, err := s.open("acme", problem)
	require.NoError(t, err)
	require.Equal(t, problem, out)
	require.Equal(t, problem, RedactRecorded(problem))
}
