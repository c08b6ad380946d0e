// Command api is Quill's HTTP API: serve (default), migrate, token
// create/revoke, and audit. See `api --help`.
package main

import (
	"io"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/daemon"
)

func main() { daemon.Main("api", run, exitCode) }

// exitCode is cli.ExitCode for this program, plus api audit's own statuses
// (1 anomalies, 3 incomplete).
func exitCode(err error, stderr io.Writer) int {
	if code, ok := auditExitCode(err, stderr); ok {
		return code
	}
	return cli.ExitCode("api", err, stderr)
}
