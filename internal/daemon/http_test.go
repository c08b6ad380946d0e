package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/httpserve"
)

// Every daemon's run command reads the HTTP server settings (so the relay
// and the worker need no line of their own), and a bad value is a usage
// error naming the variable.
func TestProgramReadsTheHTTPSettings(t *testing.T) {
	t.Parallel()
	var got daemon.Settings
	prog := daemon.Program{Name: "x", AdminAddr: ":0", Define: func(*config.Set) {}, Start: func(_ context.Context, s daemon.Settings, _ io.Writer) error {
		got = s
		return nil
	}}
	env := clitest.Env(map[string]string{"QUILL_READ_TIMEOUT": "2s", "QUILL_WRITE_TIMEOUT": "3s", "QUILL_IDLE_TIMEOUT": "4s", "QUILL_MAX_CONNECTIONS": "5"})
	require.NoError(t, prog.Main(t.Context(), []string{"run"}, env, io.Discard, io.Discard))
	require.Equal(t, httpserve.Settings{ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second, IdleTimeout: 4 * time.Second, MaxConnections: 5}, got.HTTP)
	require.NotNil(t, got.Getenv, "tracing reads the program's environment")

	err := prog.Main(t.Context(), []string{"run"}, clitest.Env(map[string]string{"QUILL_READ_TIMEOUT": "soon"}), io.Discard, io.Discard)
	require.ErrorAs(t, err, new(cli.UsageError))
	require.ErrorContains(t, err, "QUILL_READ_TIMEOUT")
}

// The admin server closes a connection whose request never completes
// within the read timeout.
func TestAdminServerClosesSlowConnections(t *testing.T) {
	t.Parallel()
	s := settings(t)
	s.HTTP = httpserve.Settings{ReadTimeout: 500 * time.Millisecond}
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
	require.NoError(t, err)
	defer d.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, daemon.Services{}) }()
	defer func() { cancel(); <-done }()
	addr := listeningAddr(t, &logs)

	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: x\r\n") // never finished
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = bufio.NewReader(c).ReadString('\n')
	require.True(t, errors.Is(err, io.EOF), "closed by the server, not by the test's deadline: %v", err)
	require.Less(t, time.Since(start), 2*time.Second)
}

// One host's idle connections to the admin address never keep a health
// probe from another host waiting: with the connection cap filled by
// connections from 127.0.0.1 (keep-alives and connections that send
// nothing), /healthz from 127.0.0.2 is answered at once — not after the
// idle host's 10s header or 120s idle timeouts.
func TestAdminServerAnswersProbesBesideAnIdleHost(t *testing.T) {
	t.Parallel()
	s := settings(t)
	s.HTTP = httpserve.Settings{MaxConnections: 16}
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
	require.NoError(t, err)
	defer d.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, daemon.Services{}) }()
	defer func() { cancel(); <-done }()
	addr := listeningAddr(t, &logs)

	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: waitLong}
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	probe := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	var idle []net.Conn
	for i := range 40 {
		c := dial("127.0.0.1")
		if i%4 == 0 {
			_ = probe(c) // a keep-alive; past the host's share it may be refused
		}
		idle = append(idle, c)
	}
	for range 3 {
		require.NoError(t, probe(dial("127.0.0.2")), "another host's probe is answered beside the idle host")
	}
	// Closed before the shutdown, which counts a connection that never
	// sent anything as busy for its first 5 seconds.
	for _, c := range idle {
		_ = c.Close()
	}
}

// A removed setting still set in the environment is a warning naming it and
// its fixed value, not silence; its flag is refused as unknown.
func TestProgramWarnsAboutRemovedSettings(t *testing.T) {
	t.Parallel()
	s := settings(t)
	prog := daemon.Program{Name: "x", Command: "serve", AdminAddr: ":0", Define: func(*config.Set) {},
		Removed: []config.Removed{{Env: "QUILL_GONE", Fixed: "42"}, {Env: "QUILL_UNSET", Fixed: "1"}},
		Start: func(ctx context.Context, ds daemon.Settings, stderr io.Writer) error {
			ds.DatabaseURL, ds.NATS = s.DatabaseURL, s.NATS
			d, err := daemon.Start(ctx, ds, daemon.Process{Name: "x", PoolSize: 2, WithoutNATS: true}, stderr)
			if err != nil {
				return err
			}
			d.Close()
			return nil
		}}
	var logs clitest.SyncBuffer
	env := clitest.Env(map[string]string{"QUILL_GONE": "7"})
	require.NoError(t, prog.Main(t.Context(), nil, env, io.Discard, &logs), "serve is the default command")
	require.Contains(t, logs.String(), `"setting":"QUILL_GONE","fixed":"42"`)
	require.NotContains(t, logs.String(), "QUILL_UNSET")
	err := prog.Main(t.Context(), []string{"serve", "--gone", "7"}, env, io.Discard, io.Discard)
	require.ErrorContains(t, err, "flag provided but not defined")
}
