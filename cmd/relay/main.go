// Command relay publishes committed outbox events to NATS JetStream, in
// order per note, and runs the retention cleanup. Several may run at once.
// See `relay --help`.
package main

import (
	"io"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/daemon"
)

func main() { daemon.Main("relay", run, exitCode) }

// exitCode is cli.ExitCode for this program.
func exitCode(err error, stderr io.Writer) int { return cli.ExitCode("relay", err, stderr) }
