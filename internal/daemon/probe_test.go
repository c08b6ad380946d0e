package daemon_test

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/testkit"
)

// The probe command asks a running daemon's admin address for /readyz
// (or /healthz with --live) and succeeds only on 200; what fails names the
// URL and the failing check, and a bad address is a usage error.
func TestProbe(t *testing.T) {
	t.Parallel()
	var logs clitest.SyncBuffer
	d, err := daemon.Start(t.Context(), settings(t), daemon.Process{Name: "test", PoolSize: 2, WithoutNATS: true}, &logs)
	require.NoError(t, err)
	defer d.Close()
	var down atomic.Bool
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, daemon.Services{Ready: map[string]metrics.ReadyFunc{"dependency": func(context.Context) error {
			if down.Load() {
				return &metrics.NotReadyError{Reason: "dependency unreachable"}
			}
			return nil
		}}})
	}()
	defer func() { cancel(); testkit.RequireReturned(t, done, waitLong) }()
	addr := listeningAddr(t, &logs)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)

	probe := func(env map[string]string, args ...string) error {
		p := daemon.Program{Name: "probed", AdminAddr: addr}
		return p.Main(t.Context(), append([]string{"probe"}, args...), func(k string) string { return env[k] }, io.Discard, io.Discard)
	}
	require.NoError(t, probe(nil), "ready")
	require.NoError(t, probe(map[string]string{"QUILL_ADMIN_ADDR": ":" + port}), "a listen address without a host is probed on loopback")
	require.NoError(t, probe(map[string]string{"QUILL_ADMIN_ADDR": "0.0.0.0:" + port}), "the unspecified address is probed on loopback")

	down.Store(true)
	err = probe(nil)
	require.EqualError(t, err, "probe http://"+addr+"/readyz answered 503: dependency: dependency unreachable")
	require.Equal(t, 1, cli.ExitCode("probed", err, io.Discard))
	require.NoError(t, probe(nil, "--live"), "alive though not ready")

	free := clitest.FreeAddr(t)
	err = probe(map[string]string{"QUILL_ADMIN_ADDR": free})
	require.ErrorContains(t, err, "probe http://"+free+"/readyz: ")
	require.Equal(t, 1, cli.ExitCode("probed", err, io.Discard), "nothing listening")

	for _, bad := range []string{"nonsense", "127.0.0.1:"} {
		err = probe(map[string]string{"QUILL_ADMIN_ADDR": bad})
		require.ErrorAs(t, err, new(cli.UsageError), bad)
	}
	require.ErrorAs(t, probe(nil, "extra"), new(cli.UsageError), "no arguments")
}
