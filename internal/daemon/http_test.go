package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/metrics"
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
	require.Equal(t, daemon.HTTPSettings{ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second, IdleTimeout: 4 * time.Second, MaxConnections: 5}, got.HTTP)

	err := prog.Main(t.Context(), []string{"run"}, clitest.Env(map[string]string{"QUILL_READ_TIMEOUT": "soon"}), io.Discard, io.Discard)
	require.ErrorAs(t, err, new(cli.UsageError))
	require.ErrorContains(t, err, "QUILL_READ_TIMEOUT")
}

// The admin server closes a connection whose request never completes
// within the read timeout.
func TestAdminServerClosesSlowConnections(t *testing.T) {
	t.Parallel()
	s := settings(t)
	s.HTTP = daemon.HTTPSettings{ReadTimeout: 500 * time.Millisecond}
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), s, daemon.Process{Name: "test", PoolSize: 2, Disconnected: "lost"}, &logs)
	require.NoError(t, err)
	defer d.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, map[string]metrics.ReadyFunc{}) }()
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

// A server's listener accepts at most MaxConnections connections open at
// once: the next waits until one of them is closed.
func TestListenLimitsConnections(t *testing.T) {
	t.Parallel()
	ln, err := daemon.HTTPSettings{MaxConnections: 2}.Listen("127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
	}
	first, second := <-accepted, <-accepted
	defer second.Close()
	select {
	case c := <-accepted:
		c.Close()
		t.Fatal("a third connection was accepted while two were open")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, first.Close())
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(waitLong):
		t.Fatal("the third connection was not accepted after one closed")
	}
}
