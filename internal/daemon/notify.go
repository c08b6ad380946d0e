package daemon

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/wait"
)

// NotifySocketEnv names the variable through which systemd gives a
// Type=notify service its notification socket (sd_notify(3)). It is
// systemd's, not a Quill setting: it is read, never defined with a flag.
const NotifySocketEnv = "NOTIFY_SOCKET"

// Readiness states sent to the service manager.
const (
	StateReady    = "READY=1"
	StateStopping = "STOPPING=1"
)

// readyCheckTimeout bounds one round of the readiness checks, as /readyz
// bounds its own.
const readyCheckTimeout = 2 * time.Second

// Notify sends state to the service manager's notification socket; an
// empty socket (the process was not started by systemd as Type=notify)
// sends nothing. A socket name starting with '@' is in the abstract
// namespace, which Go's unix addresses read as systemd writes it. It
// returns the dial or write error, naming the socket.
//
// The protocol is one datagram of newline-separated assignments, which
// sd_notify(3) documents as stable; written here rather than taken from
// go-systemd, whose SdNotify reads the process environment itself, so that
// run's getenv (and a test's socket) decide.
func Notify(socket, state string) error {
	if socket == "" {
		return nil
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("notify %s: %w", socket, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify %s: %w", socket, err)
	}
	return nil
}

// NotifyReady tells the service manager at socket that the process is
// ready once every check passes — the checks /readyz answers with, so
// systemd's readiness is what /readyz's first 200 would say — and that it
// is stopping once ctx ends. The caller runs it once its listeners listen.
// With an empty socket it returns at once. It returns nil when ctx ends:
// a manager that cannot be told is logged on log, never a reason to stop
// serving.
func NotifyReady(ctx context.Context, log zerolog.Logger, socket string, checks map[string]metrics.ReadyFunc) error {
	if socket == "" {
		return nil
	}
	b := wait.Backoff{Base: 50 * time.Millisecond, Max: time.Second}
	for !ready(ctx, checks) {
		if !wait.For(ctx, b.Next()) {
			break
		}
	}
	if ctx.Err() == nil {
		if err := Notify(socket, StateReady); err != nil {
			log.Warn().Err(err).Msg("cannot tell the service manager that the process is ready")
		} else {
			log.Info().Msg("ready: the service manager was told")
		}
		<-ctx.Done()
	}
	if err := Notify(socket, StateStopping); err != nil {
		log.Warn().Err(err).Msg("cannot tell the service manager that the process is stopping")
	}
	return nil
}

// ready reports whether every check passes, each round bounded by
// readyCheckTimeout.
func ready(ctx context.Context, checks map[string]metrics.ReadyFunc) bool {
	cctx, cancel := context.WithTimeout(ctx, readyCheckTimeout)
	defer cancel()
	for _, check := range checks {
		if check(cctx) != nil {
			return false
		}
	}
	return true
}
