// Command webhook-dispatcher delivers Quill's events to tenants' webhook
// endpoints (SPEC §11): a durable consumer of the stream records a delivery
// per subscribed endpoint and event, and a sender POSTs each, signed,
// retried under the same webhook-id until a 2xx or the retry horizon. Its
// operator commands list and re-send deliveries and enable endpoints. See
// `webhook-dispatcher --help` and docs/webhooks.md.
package main

import (
	"io"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/daemon"
)

func main() { daemon.Main("webhook-dispatcher", run, exitCode) }

// exitCode is cli.ExitCode for this program.
func exitCode(err error, stderr io.Writer) int {
	return cli.ExitCode("webhook-dispatcher", err, stderr)
}
