package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/worker"
)

// TestMain fails the package if a test leaves a goroutine behind (other
// than what a cluster node's in-process restart may leave of nats-server).
// Run with helperEnv set, the test binary is the worker program instead
// (see startProcess): the tests that need a process of its own — one that
// dies, one whose memory is measured — run it so.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m, natstest.ClusterLeakOptions()...)
}

// Environment of the helper process.
const (
	// helperEnv makes the test binary run the worker.
	helperEnv = "QUILL_TEST_HELPER_WORKER"
	// crashEnv names an event whose processing makes the process exit
	// with crashStatus at once, as an out-of-memory kill would.
	crashEnv    = "QUILL_TEST_CRASH_EVENT"
	crashStatus = 3
	// batchWaitEnv sets the group commit's wait (worker.BatchWait, a
	// constant of the program), so that events published together are
	// one batch.
	batchWaitEnv = "QUILL_TEST_BATCH_WAIT"
)

// helperMain runs the worker program until SIGTERM, with the crash hook
// when crashEnv is set, and returns its exit status.
func helperMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var opts []worker.Option
	if ev := os.Getenv(crashEnv); ev != "" {
		opts = append(opts, worker.WithHooks(worker.Hooks{BeforeProcess: func(id string, _ int) error {
			if id == ev {
				os.Exit(crashStatus)
			}
			return nil
		}}))
	}
	var tune func(*worker.Config)
	if v := os.Getenv(batchWaitEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			panic(err)
		}
		tune = func(c *worker.Config) { c.Consumer.MaxBatchWait = d }
	}
	return exitCode(runWith(ctx, nil, os.Getenv, os.Stdout, os.Stderr, tune, opts...), os.Stderr)
}
