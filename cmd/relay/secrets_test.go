package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/testkit"
)

// requireNoSecret fails when any of secrets is in any of outputs.
func requireNoSecret(t *testing.T, secrets []string, outputs ...string) {
	t.Helper()
	for _, out := range outputs {
		for _, s := range secrets {
			require.NotContains(t, out, s, "a NATS_URL secret is printed")
		}
	}
}

// TestNATSURLSecretsAreNeverPrinted: a NATS_URL holding a password or a
// token never shows it — not in the usage error of a bad server list, not
// in the log line of a server that refuses, not in the log line of a
// reconnect (nats.go's own redaction keeps a token).
func TestNATSURLSecretsAreNeverPrinted(t *testing.T) {
	t.Parallel()
	secrets := []string{"pa55word", "t0kenvalue"}
	refusing := clitest.FreeAddr(t)
	for _, tc := range []struct {
		name, url string
		status    int
	}{
		{name: "a server that refuses", url: "nats://quill:pa55word@" + refusing + ",nats://t0kenvalue@" + refusing, status: 1},
		{name: "a bad entry in the list", url: "nats://quill:pa55word@" + refusing + ",nats://t0kenvalue@" + refusing + ":x", status: 2},
		{name: "not a URL", url: "nats://quill:pa55%word@" + refusing, status: 2},
		{name: "no host", url: "nats://t0kenvalue@", status: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			w.vars["NATS_URL"] = tc.url
			stdout, logs, err := clitest.RunOut(t, run, clitest.Env(w.vars))
			require.Error(t, err)
			var printed strings.Builder
			require.Equal(t, tc.status, exitCode(err, &printed))
			require.Contains(t, printed.String()+logs, "NATS_URL", "the message names the setting")
			requireNoSecret(t, append(secrets, "pa55%word"), stdout, logs, err.Error(), printed.String())
		})
	}

	t.Run("a reconnect", func(t *testing.T) {
		t.Parallel()
		w := newWorld(t)
		// A server without authorization takes any token.
		w.vars["NATS_URL"] = strings.Replace(w.srv.URL(), "nats://", "nats://t0kenvalue@", 1)
		p := clitest.Start(t, run, clitest.Env(w.vars))
		readyz := "http://" + w.admin + "/readyz"
		waitStatus(t, readyz, http.StatusOK)
		w.srv.Restart(t)
		testkit.WaitFor(t, waitLong, func() bool {
			return strings.Contains(p.Stderr.String(), `"message":"NATS connection restored"`)
		}, "the reconnect's log line")
		require.NoError(t, p.Stop())
		logs := p.Stderr.String()
		require.Contains(t, logs, `"server":"nats://xxxxx@127.0.0.1:`)
		requireNoSecret(t, secrets, logs)
	})
}
