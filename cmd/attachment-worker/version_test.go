package main

import (
	"testing"

	"github.com/quillhq/quill/internal/clitest"
)

// TestVersion runs the real program: --version, -version and version, on
// the program or any of its commands, answer one line on stdout and exit 0
// without reading the settings (a bad one does not stop it) or reaching
// PostgreSQL or NATS.
func TestVersion(t *testing.T) {
	t.Parallel()
	clitest.RequireVersion(t, "attachment-worker", run, exitCode, [][]string{{"run", "--version"}, {"dead-letters", "--version"}, {"dead-letters", "retry", "--version"}, {"probe", "--version"}}...)
}
