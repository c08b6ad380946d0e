// Command api is Quill's HTTP API: serve (default), migrate, and token
// create/revoke. See `api --help`.
package main

import (
	"io"

	"github.com/quillhq/quill/internal/cli"
)

func main() { cli.Main("api", run) }

// exitCode is cli.ExitCode for this program.
func exitCode(err error, stderr io.Writer) int { return cli.ExitCode("api", err, stderr) }
