// Command api is Quill's HTTP API: serve (default), migrate, token
// create/revoke, and audit. See `api --help`.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/quillhq/quill/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode is cli.ExitCode for this program, plus api audit's own statuses
// (1 anomalies, 3 incomplete).
func exitCode(err error, stderr io.Writer) int {
	if code, ok := auditExitCode(err, stderr); ok {
		return code
	}
	return cli.ExitCode("api", err, stderr)
}
