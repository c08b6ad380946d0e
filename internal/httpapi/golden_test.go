package httpapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/testkit"
)

// The problem+json bodies clients and agents parse, pinned.
func TestProblemBodiesGolden(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.create(b.tokenA, "g1", note("golden")).status)
	cases := map[string]req{
		"key_missing.json":     {method: http.MethodPost, path: "/v1/notes", token: b.tokenA, body: note("x"), offContract: "no key"},
		"key_reused.json":      {method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "g1", body: map[string]any{"title": "changed", "body": "b"}},
		"validation.json":      {method: http.MethodPost, path: "/v1/notes", token: b.tokenA, key: "g2", body: map[string]any{"title": "", "body": "a\u0000b"}, offContract: "invalid fields"},
		"unauthenticated.json": {method: http.MethodGet, path: "/v1/notes", offContract: "no token"},
		"op_not_found.json":    {method: http.MethodGet, path: "/v1/operations/nope", token: b.tokenA},
	}
	for name, r := range cases {
		res := b.mustDo(r)
		require.Equal(t, "application/problem+json", res.header.Get("Content-Type"), name)
		testkit.Golden(t, name, res.body, testkit.ScrubIDsAndTimes)
	}
	b.clock.advance(responseRetention + time.Second)
	testkit.Golden(t, "result_expired.json", b.create(b.tokenA, "g1", note("golden")).body, testkit.ScrubIDsAndTimes)
}
