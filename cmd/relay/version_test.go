package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
)

// TestVersion runs the real program: --version, -version and version, on
// the program or any of its commands, answer one line on stdout and exit 0
// without reading the settings (a bad one does not stop it) or reaching
// PostgreSQL or NATS.
func TestVersion(t *testing.T) {
	t.Parallel()
	line := buildinfo.Read().Line("relay") + "\n"
	bad := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x", "NATS_URL": "nats://127.0.0.1:1", "QUILL_LOG_LEVEL": "loud", "QUILL_READ_TIMEOUT": "soon"}
	for _, args := range [][]string{
		{"--version"},
		{"-version"},
		{"version"},
		{"run", "--version"},
		{"--admin-addr", ":1", "--version"},
		{"events", "--version"},
		{"events", "list", "--version"},
	} {
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
