// Command quill is the agent's side of Quill on the command line: it creates
// and deletes notes as operations with stable keys, journals each write
// before sending it, retries safely, looks outcomes up, resumes unfinished
// operations after a crash, and serves the same tools to an AI agent over
// MCP (quill mcp).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}
