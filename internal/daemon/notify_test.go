package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/testkit"
)

// notifySocket listens as systemd's notification socket does and returns
// its name and the datagrams it receives. abstract names it in the
// abstract namespace ("@…"), as systemd may.
func notifySocket(t *testing.T, abstract bool) (string, <-chan string) {
	t.Helper()
	name := "@quill-test-notify-" + strings.ReplaceAll(t.Name(), "/", "-")
	if !abstract {
		// A unix socket's path is short (108 bytes): not under t.TempDir.
		dir, err := os.MkdirTemp("", "qn")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		name = filepath.Join(dir, "notify")
	}
	return name, clitest.NotifySocket(t, name)
}

func receive(t *testing.T, got <-chan string) string {
	t.Helper()
	select {
	case s := <-got:
		return s
	case <-time.After(waitLong):
		t.Fatal("no notification")
		return ""
	}
}

func requireNothing(t *testing.T, got <-chan string, d time.Duration) {
	t.Helper()
	select {
	case s := <-got:
		t.Fatalf("unexpected notification %q", s)
	case <-time.After(d):
	}
}

// Notify sends one datagram to a socket by path or in the abstract
// namespace, nothing without a socket, and names the socket it cannot
// reach.
func TestNotify(t *testing.T) {
	t.Parallel()
	for _, abstract := range []bool{false, true} {
		name, got := notifySocket(t, abstract)
		require.NoError(t, daemon.Notify(name, daemon.StateReady))
		require.Equal(t, "READY=1", receive(t, got), name)
	}
	require.NoError(t, daemon.Notify("", daemon.StateReady))
	err := daemon.Notify("/nonexistent/notify", daemon.StateReady)
	require.ErrorContains(t, err, "/nonexistent/notify")
}

// NotifyReady says READY=1 only once every check passes, then STOPPING=1
// when its context ends; without a socket it returns at once.
func TestNotifyReady(t *testing.T) {
	t.Parallel()
	name, got := notifySocket(t, false)
	var failures atomic.Int32
	failures.Store(3)
	checks := map[string]metrics.ReadyFunc{
		"ok": func(context.Context) error { return nil },
		"later": func(context.Context) error {
			if failures.Add(-1) >= 0 {
				return errors.New("not yet")
			}
			return nil
		},
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- daemon.NotifyReady(ctx, zerolog.Nop(), name, checks) }()
	require.Equal(t, "READY=1", receive(t, got))
	require.Less(t, failures.Load(), int32(0), "READY=1 came after the failing checks passed")
	requireNothing(t, got, 100*time.Millisecond)
	cancel()
	require.Equal(t, "STOPPING=1", receive(t, got))
	require.NoError(t, <-done)

	require.NoError(t, daemon.NotifyReady(t.Context(), zerolog.Nop(), "", checks), "no socket: returns at once")
}

// A daemon's Run tells systemd it is ready when /readyz would say 200, and
// that it is stopping when its context ends.
func TestRunNotifiesSystemd(t *testing.T) {
	t.Parallel()
	s := settings(t)
	name, got := notifySocket(t, true)
	s.NotifySocket = name
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
	require.NoError(t, err)
	defer d.Close()
	var ready atomic.Bool
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, daemon.Services{Ready: map[string]metrics.ReadyFunc{"gate": func(context.Context) error {
			if !ready.Load() {
				return errors.New("not yet")
			}
			return nil
		}}})
	}()
	addr := listeningAddr(t, &logs)
	requireNothing(t, got, 300*time.Millisecond)
	ready.Store(true)
	require.Equal(t, "READY=1", receive(t, got))
	res, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	cancel()
	require.Equal(t, "STOPPING=1", receive(t, got))
	require.NoError(t, <-done)
}

// While LogHangups runs, a SIGHUP is logged and changes nothing; after its
// stop, one is ignored silently (Go's default would end the process). Not
// parallel: signals are the process's, and the parallel tests' Runs start
// and stop LogHangups of their own.
func TestLogHangups(t *testing.T) {
	var logs clitest.SyncBuffer
	stop := daemon.LogHangups(zerolog.New(&logs))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	testkit.WaitFor(t, waitLong, func() bool { return strings.Contains(logs.String(), "SIGHUP ignored") }, "the SIGHUP is logged")
	stop()
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	time.Sleep(100 * time.Millisecond) // nothing to poll for: the test binary must merely still run
	require.Equal(t, 1, strings.Count(logs.String(), "SIGHUP ignored"))
}
