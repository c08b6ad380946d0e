package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
)

// TestDaemonOverTLSWithCredentials runs the relay against a NATS server
// that requires TLS with a client certificate and operator-mode
// credentials, configured only through QUILL_NATS_CREDS and
// QUILL_NATS_TLS_*: it provisions the stream and publishes, and after the
// server restarts it reconnects with the same certificate and credentials
// and publishes what was written meanwhile.
func TestDaemonOverTLSWithCredentials(t *testing.T) {
	t.Parallel()
	pki, op := natstest.NewPKI(t), natstest.NewOperator(t)
	w := newWorld(t)
	w.srv = natstest.Start(t, natstest.WithTLS(pki), natstest.WithOperator(op))
	_, w.js = w.srv.Connect(t)
	w.vars["NATS_URL"] = w.srv.URL()
	w.vars["QUILL_NATS_CREDS"] = op.Creds()
	w.vars["QUILL_NATS_TLS_CA"] = pki.CA
	w.vars["QUILL_NATS_TLS_CERT"] = pki.ClientCert
	w.vars["QUILL_NATS_TLS_KEY"] = pki.ClientKey

	p := clitest.Start(t, run, clitest.Env(w.vars))
	// Ready, or failed at start (then fail now, with its log, rather than
	// after waitLong).
	readyz := "http://" + w.admin + "/readyz"
	testkit.WaitFor(t, waitLong, func() bool {
		if strings.Contains(p.Stderr.String(), `"cannot start`) {
			return true
		}
		res, err := http.Get(readyz)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, "the relay to be ready")
	require.NotContains(t, p.Stderr.String(), `"cannot start`)
	for range 3 {
		w.write(w.tenant)
	}
	w.waitPublished(3)

	w.srv.Restart(t)
	for range 3 {
		w.write(w.tenant)
	}
	w.waitPublished(6)
	require.Len(t, w.streamIDs(), 6)
	require.NoError(t, p.Stop())
	require.Contains(t, p.Stderr.String(), `"message":"NATS connection restored"`)
}

// TestDaemonRefusedByTLSOrCredentials: when the server refuses the
// connection — no client certificate, a server certificate not verified,
// no credentials — the relay does not start: exit 1 and one logged line
// whose error says why.
func TestDaemonRefusedByTLSOrCredentials(t *testing.T) {
	t.Parallel()
	schema := dbtest.Schema(t)
	pki, op := natstest.NewPKI(t), natstest.NewOperator(t)
	srv := natstest.Start(t, natstest.WithTLS(pki), natstest.WithOperator(op))
	all := map[string]string{"DATABASE_URL": schema, "NATS_URL": srv.URL(), "QUILL_NATS_CREDS": op.Creds(),
		"QUILL_NATS_TLS_CA": pki.CA, "QUILL_NATS_TLS_CERT": pki.ClientCert, "QUILL_NATS_TLS_KEY": pki.ClientKey}
	for _, tc := range []struct {
		name    string
		without []string
		err     string // a regular expression
	}{
		// Under TLS 1.3 the client may find the connection closed
		// instead of reading the server's alert.
		{name: "no client certificate", without: []string{"QUILL_NATS_TLS_CERT", "QUILL_NATS_TLS_KEY"},
			err: "certificate required|connection closed by remote after TLS handshake"},
		{name: "no CA", without: []string{"QUILL_NATS_TLS_CA"}, err: "certificate signed by unknown authority"},
		{name: "no credentials", without: []string{"QUILL_NATS_CREDS"}, err: "Authorization Violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vars := map[string]string{"QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}
			for k, v := range all {
				vars[k] = v
			}
			for _, k := range tc.without {
				delete(vars, k)
			}
			_, logs, err := clitest.RunOut(t, run, clitest.Env(vars))
			var stderr bytes.Buffer
			require.Equal(t, 1, exitCode(err, &stderr), "%v", err)
			line := onlyLogLine(t, logs)
			require.Equal(t, "nats_unreachable", line["error_category"])
			require.Regexp(t, tc.err, line["error"])
		})
	}
}
