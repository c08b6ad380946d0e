// Command attachment-worker consumes note.created events from a durable JetStream
// consumer and processes their attachments once per event, through an inbox,
// with dead letters an operator can list and re-drive. See `attachment-worker --help`.
package main

import (
	"io"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/daemon"
)

func main() { daemon.Main("attachment-worker", run, exitCode) }

// exitCode is cli.ExitCode for this program.
func exitCode(err error, stderr io.Writer) int { return cli.ExitCode("attachment-worker", err, stderr) }
