package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// helperEnv makes the test binary run the dispatcher program instead of
// the tests: for the test whose dispatcher is killed (see startProcess).
const helperEnv = "QUILL_TEST_HELPER_DISPATCHER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		code := exitCode(run(ctx, nil, os.Getenv, os.Stdout, os.Stderr), os.Stderr)
		stop()
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}
