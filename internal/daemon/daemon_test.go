package daemon_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
)

const waitLong = 30 * time.Second

func settings(t *testing.T) daemon.Settings {
	t.Helper()
	_, dbURL := dbtest.Pool(t, 2)
	srv := natstest.Start(t)
	return daemon.Settings{CommandSettings: daemon.CommandSettings{DatabaseURL: dbURL, LogLevel: "info"},
		NATS: natsconn.Settings{URL: srv.URL()}, AdminAddr: "127.0.0.1:0"}
}

// Start refuses what cannot work with the error kind that decides the exit
// status, and one log line for an unreachable dependency.
func TestStartRefuses(t *testing.T) {
	t.Parallel()
	good := settings(t)
	for _, tc := range []struct {
		name     string
		mod      func(*daemon.Settings)
		category string // "": a usage error
	}{
		{"bad log level", func(s *daemon.Settings) { s.LogLevel = "loud" }, ""},
		{"database unreachable", func(s *daemon.Settings) { s.DatabaseURL = "postgres://postgres@127.0.0.1:1/x?sslmode=disable" }, "database_unreachable"},
		{"nats unreachable", func(s *daemon.Settings) { s.NATS.URL = "nats://127.0.0.1:1" }, "nats_unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := good
			tc.mod(&s)
			var logs clitest.SyncBuffer
			d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
			require.Nil(t, d)
			if tc.category == "" {
				require.ErrorAs(t, err, new(cli.UsageError))
				return
			}
			require.ErrorAs(t, err, new(cli.LoggedError))
			require.Equal(t, 1, strings.Count(logs.String(), "\n"), "one log line: %s", logs.String())
			require.Contains(t, logs.String(), `"error_category":"`+tc.category+`"`)
		})
	}
}

// Run serves the admin address and the services until the context ends,
// then returns nil after every service returned, and logs "stopped"; a
// failing service stops the others and is returned.
func TestRunServesAndStops(t *testing.T) {
	t.Parallel()
	s := settings(t)
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
	require.NoError(t, err)
	defer d.Close()

	ctx, cancel := context.WithCancel(t.Context())
	returned := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, daemon.Services{Ready: map[string]metrics.ReadyFunc{"postgres": d.Pool.Ping}, Loops: []func(context.Context) error{func(ctx context.Context) error {
			<-ctx.Done()
			close(returned)
			return nil
		}}})
	}()
	addr := listeningAddr(t, &logs)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		res, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, path)
	}
	cancel()
	testkit.RequireReturned(t, done, waitLong)
	<-returned
	require.Contains(t, logs.String(), `"message":"stopped"`)
	_, err = net.DialTimeout("tcp", addr, time.Second)
	require.Error(t, err, "the admin server is shut down")

	failure := errors.New("service failed")
	err = d.Run(t.Context(), daemon.Services{Loops: []func(context.Context) error{func(context.Context) error { return failure }, func(ctx context.Context) error {
		<-ctx.Done()
		return nil
	}}})
	require.ErrorIs(t, err, failure)
}

// A daemon's own server is served beside the admin server and shut down
// with it, the admin handler takes the daemon's wrapper, and a trailing
// service's context ends only after the servers and the loops returned.
func TestRunServersAndTrailing(t *testing.T) {
	t.Parallel()
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), settings(t), daemon.Process{Name: "test", PoolSize: 2, WithoutNATS: true}, &logs)
	require.NoError(t, err)
	defer d.Close()
	require.Nil(t, d.NATS, "WithoutNATS connects to none")
	own := clitest.FreeAddr(t)
	loopDone, trailingDone := make(chan struct{}), make(chan struct{})
	var loopReturned bool
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, daemon.Services{
			Admin: func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("X-Wrapped", "yes")
					next.ServeHTTP(w, r)
				})
			},
			Servers: []daemon.Server{{Name: "own", Addr: own, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })}},
			Loops: []func(context.Context) error{func(ctx context.Context) error {
				<-ctx.Done()
				time.Sleep(100 * time.Millisecond) // work finishing during the shutdown
				loopReturned = true
				close(loopDone)
				return nil
			}},
			Trailing: []func(context.Context) error{func(ctx context.Context) error {
				<-ctx.Done()
				select {
				case <-loopDone:
				default:
					t.Error("a trailing service was stopped before the loops returned")
				}
				close(trailingDone)
				return nil
			}},
		})
	}()
	addr := listeningAddr(t, &logs)
	res, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, "yes", res.Header.Get("X-Wrapped"))
	testkit.WaitFor(t, waitLong, func() bool { return strings.Contains(logs.String(), `"listener":"own"`) }, "the own server listens")
	res, err = http.Get("http://" + own + "/")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusTeapot, res.StatusCode)
	cancel()
	testkit.RequireReturned(t, done, waitLong)
	<-trailingDone
	require.True(t, loopReturned)
	_, err = net.DialTimeout("tcp", own, time.Second)
	require.Error(t, err, "the own server is shut down")
}

// Run refuses an admin address it cannot listen on, with one log line.
func TestRunRefusesABusyAdminAddress(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	s := settings(t)
	s.AdminAddr = ln.Addr().String()
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
	require.NoError(t, err)
	defer d.Close()
	err = d.Run(t.Context(), daemon.Services{Loops: []func(context.Context) error{func(context.Context) error { t.Error("a service ran"); return nil }}})
	require.ErrorAs(t, err, new(cli.LoggedError))
	require.Contains(t, logs.String(), "cannot listen on the admin address")
}

// A failed start-up step is one log line with its category and a logged
// error; a step that succeeds returns nil.
func TestProvision(t *testing.T) {
	t.Parallel()
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), settings(t), daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
	require.NoError(t, err)
	defer d.Close()
	require.NoError(t, d.Provision(t.Context(), "x_failed", "cannot start", func(ctx context.Context) error {
		_, ok := ctx.Deadline()
		require.True(t, ok, "the step is bounded")
		return nil
	}))
	failure := errors.New("no stream")
	err = d.Provision(t.Context(), "stream_provisioning_failed", "cannot start: no stream", func(context.Context) error { return failure })
	require.ErrorIs(t, err, failure)
	require.ErrorAs(t, err, new(cli.LoggedError))
	require.Contains(t, logs.String(), `"error_category":"stream_provisioning_failed"`)
}

// An operator command opens the database only, and refuses what Start
// refuses in the same way.
func TestCommandSettingsOpen(t *testing.T) {
	t.Parallel()
	c := settings(t).CommandSettings
	_, pool, err := c.Open(t.Context(), "test", io.Discard)
	require.NoError(t, err)
	require.NoError(t, pool.Ping(t.Context()))
	pool.Close()

	bad := c
	bad.LogLevel = "loud"
	_, _, err = bad.Open(t.Context(), "test", io.Discard)
	require.ErrorAs(t, err, new(cli.UsageError))
	bad = c
	bad.DatabaseURL = "postgres://postgres@127.0.0.1:1/x?sslmode=disable"
	var logs clitest.SyncBuffer
	_, _, err = bad.Open(t.Context(), "test", &logs)
	require.ErrorAs(t, err, new(cli.LoggedError))
	require.Equal(t, 1, strings.Count(logs.String(), "\n"), "one log line: %s", logs.String())
	require.Contains(t, logs.String(), `"error_category":"database_unreachable"`)
}

// listeningAddr waits until the admin server logs that it listens and
// returns its address.
func listeningAddr(t *testing.T, logs *clitest.SyncBuffer) string {
	t.Helper()
	var addr string
	testkit.WaitFor(t, waitLong, func() bool {
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, `"message":"listening"`) {
				_, rest, _ := strings.Cut(line, `"addr":"`)
				addr, _, _ = strings.Cut(rest, `"`)
				return true
			}
		}
		return false
	}, "the admin server listens")
	return addr
}

// With a ShutdownDelay, the end of the context turns /readyz to 503 at
// once while the servers and the loops keep working; the shutdown begins
// only after the delay.
func TestRunDelaysTheShutdown(t *testing.T) {
	t.Parallel()
	s := settings(t)
	const delay = 2 * time.Second
	s.ShutdownDelay = delay
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, WithoutNATS: true}, &logs)
	require.NoError(t, err)
	defer d.Close()
	own := clitest.FreeAddr(t)
	loopStopped := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, daemon.Services{
			Ready:   map[string]metrics.ReadyFunc{"postgres": d.Pool.Ping},
			Servers: []daemon.Server{{Name: "own", Addr: own, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })}},
			Loops: []func(context.Context) error{func(ctx context.Context) error {
				<-ctx.Done()
				loopStopped <- time.Now()
				return nil
			}},
		})
	}()
	addr := listeningAddr(t, &logs)
	get := func(url string) (int, string) {
		res, err := http.Get(url)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	testkit.WaitFor(t, waitLong, func() bool { return strings.Contains(logs.String(), `"listener":"own"`) }, "the own server listens")
	code, _ := get("http://" + addr + "/readyz")
	require.Equal(t, http.StatusOK, code, "ready before the signal")

	signalled := time.Now()
	cancel()
	testkit.WaitFor(t, waitLong, func() bool {
		code, _ := get("http://" + addr + "/readyz")
		return code == http.StatusServiceUnavailable
	}, "/readyz answers 503 once stopping")
	_, body := get("http://" + addr + "/readyz")
	require.Equal(t, "shutdown: stopping\n", body)
	code, _ = get("http://" + addr + "/healthz")
	require.Equal(t, http.StatusOK, code, "alive during the delay")
	code, _ = get("http://" + own + "/")
	require.Equal(t, http.StatusTeapot, code, "the daemon's own server still serves during the delay")
	select {
	case <-loopStopped:
		if time.Since(signalled) < delay {
			t.Fatal("the loops were stopped before the delay ended")
		}
	default:
	}

	testkit.RequireReturned(t, done, waitLong)
	require.GreaterOrEqual(t, (<-loopStopped).Sub(signalled), delay, "the shutdown begins after the delay")
	require.Contains(t, logs.String(), `"shutdown_delay"`)
	_, err = net.DialTimeout("tcp", own, time.Second)
	require.Error(t, err, "then the servers are shut down")
}
