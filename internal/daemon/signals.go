package daemon

import (
	"context"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/quillhq/quill/internal/cli"
)

// Main is a daemon's main (api, relay, attachment-worker): it runs run with
// the process's arguments, environment and streams, cancelling its context
// on the first SIGINT or SIGTERM — run then finishes its in-flight work and
// returns — and exits with exitCode's status. SIGHUP is ignored from the
// start: a daemon's settings are read once, so the conventional "reload"
// has nothing to reload, and Go's default for SIGHUP — exit at once,
// abandoning the work in flight, with a status systemd counts as clean and
// so does not restart — would surprise whoever sent it. While the daemon
// runs, LogHangups says so in the log.
func Main(prog string, run cli.RunFunc, exitCode func(err error, stderr io.Writer) int) {
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// LogHangups logs each SIGHUP the process receives, as ignored, until the
// returned stop is called; then SIGHUP is ignored silently again, as Main
// leaves it. (signal.Ignore is how to go back without a moment of Go's
// default in between; it ends every Notify of SIGHUP in the process, which
// runs one daemon.)
func LogHangups(log zerolog.Logger) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ch:
				log.Warn().Str("signal", "SIGHUP").Msg("SIGHUP ignored: settings are read once, at start-up; restart the process to apply new ones (SIGTERM stops it gracefully)")
			case <-done:
				return
			}
		}
	})
	return func() {
		signal.Ignore(syscall.SIGHUP)
		close(done)
		wg.Wait()
	}
}
