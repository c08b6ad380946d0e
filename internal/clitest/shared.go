package clitest

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
	"github.com/quillhq/quill/internal/cli"
)

// RequireVersion runs prog's real run with --version, -version and version,
// and with each of extra (a command's arguments ending in --version): each
// must answer prog's version line on stdout, nothing on stderr, and exit 0
// (exitCode's status for run's error) without reading the settings — a bad
// one does not stop it — or reaching PostgreSQL or NATS.
func RequireVersion(t *testing.T, prog string, run cli.RunFunc, exitCode func(error, io.Writer) int, extra ...[]string) {
	t.Helper()
	line := buildinfo.Read().Line(prog) + "\n"
	bad := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x", "NATS_URL": "nats://127.0.0.1:1", "QUILL_LOG_LEVEL": "loud", "QUILL_READ_TIMEOUT": "soon"}
	for _, args := range slices.Concat([][]string{{"--version"}, {"-version"}, {"version"}}, extra) {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), args, func(k string) string { return bad[k] }, &stdout, &stderr)
			require.Equal(t, 0, exitCode(err, &stderr), "%v", err)
			require.Equal(t, line, stdout.String())
			require.Empty(t, stderr.String())
		})
	}
}

// Collector is a stand-in OTLP/HTTP collector: it accepts every export and
// records its method and path.
type Collector struct {
	// URL is the collector's base URL.
	URL   string
	mu    sync.Mutex
	posts []string
}

// NewCollector starts a Collector for the rest of the test.
func NewCollector(t testing.TB) *Collector {
	c := &Collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c.mu.Lock()
		c.posts = append(c.posts, r.Method+" "+r.URL.Path)
		c.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

// Posts returns the exports received so far, as "METHOD /path".
func (c *Collector) Posts() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.posts)
}
