package main

import (
	"testing"

	"github.com/quillhq/quill/internal/clitest"
)

// TestVersion runs the real program: --version on the program or any of its
// commands answers one line and exits 0 without reading the settings.
func TestVersion(t *testing.T) {
	t.Parallel()
	clitest.RequireVersion(t, "webhook-dispatcher", run, exitCode, [][]string{{"run", "--version"}, {"deliveries", "--version"},
		{"deliveries", "retry", "--version"}, {"endpoints", "enable", "--version"}}...)
}
