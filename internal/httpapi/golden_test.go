package httpapi_test

import (
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite golden files")

var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
var timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z`)

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	got = uuidRE.ReplaceAll(got, []byte("00000000-0000-0000-0000-000000000000"))
	got = timeRE.ReplaceAll(got, []byte("2006-01-02T15:04:05.000000Z"))
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -update to create %s", path)
	require.Equal(t, string(want), string(got))
}

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
		golden(t, name, res.body)
	}
	b.clock.advance(responseRetention + time.Second)
	golden(t, "result_expired.json", b.create(b.tokenA, "g1", note("golden")).body)
}
