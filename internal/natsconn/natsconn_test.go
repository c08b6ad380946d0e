package natsconn_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
)

// files writes a CA certificate, a client certificate with its key, a
// second key that does not match, a credentials file and a junk file.
type files struct{ ca, cert, key, otherKey, creds, junk, missing string }

func writeFiles(t *testing.T) files {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, blocks ...*pem.Block) string {
		var b bytes.Buffer
		for _, bl := range blocks {
			require.NoError(t, pem.Encode(&b, bl))
		}
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b.Bytes(), 0o600))
		return p
	}
	newKey := func() (*ecdsa.PrivateKey, *pem.Block) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		der, err := x509.MarshalECPrivateKey(k)
		require.NoError(t, err)
		return k, &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
	}
	caKey, _ := newKey()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	clientKey, clientPEM := newKey()
	ctmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "quill"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	certDER, err := x509.CreateCertificate(rand.Reader, ctmpl, ca, &clientKey.PublicKey, caKey)
	require.NoError(t, err)
	_, otherPEM := newKey()
	creds := filepath.Join(dir, "user.creds")
	require.NoError(t, os.WriteFile(creds, []byte("-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QifQ.e30.x\n------END NATS USER JWT------\n\n"+
		"-----BEGIN USER NKEY SEED-----\nSUAEXAMPLE\n------END USER NKEY SEED------\n"), 0o600))
	return files{
		ca:       write("ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		cert:     write("client.pem", &pem.Block{Type: "CERTIFICATE", Bytes: certDER}),
		key:      write("client-key.pem", clientPEM),
		otherKey: write("other-key.pem", otherPEM),
		creds:    creds,
		junk:     write("junk.pem"),
		missing:  filepath.Join(dir, "missing"),
	}
}

// parse defines the settings on a fresh set and parses env, then
// validates them, as a process does at start.
func parse(env map[string]string, args ...string) (natsconn.Settings, error) {
	var c natsconn.Settings
	s := config.New("relay run", "usage", func(k string) string { return env[k] }, &bytes.Buffer{})
	c.Define(s, "NATS")
	if err := s.Parse(args); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func TestSettings(t *testing.T) {
	t.Parallel()
	f := writeFiles(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		err  string // "" for valid
		opts int    // nats.Options for the files
	}{
		{name: "defaults"},
		{name: "one URL", env: map[string]string{"NATS_URL": "nats://n1:4222"}},
		{name: "a cluster's list", env: map[string]string{"NATS_URL": "nats://n1:4222, nats://n2:4222,tls://n3:4223"}},
		{name: "host:port without a scheme", env: map[string]string{"NATS_URL": "n1:4222,n2"}},
		{name: "a flag wins", env: map[string]string{"NATS_URL": ",,"}, args: []string{"--nats-url", "nats://n1:4222"}},
		{name: "an empty entry", env: map[string]string{"NATS_URL": "nats://n1:4222,,nats://n3:4222"},
			err: `invalid NATS_URL "nats://n1:4222,,nats://n3:4222": server 2 of 3 is empty`},
		{name: "a bad port", env: map[string]string{"NATS_URL": "nats://n1:4222,nats://n2:http"}, err: `invalid NATS_URL`},
		{name: "a port out of range", env: map[string]string{"NATS_URL": "nats://n1:70000"}, err: `port "70000" is not 1 to 65535`},
		{name: "no host", env: map[string]string{"NATS_URL": "nats://:4222"}, err: `has no host`},
		{name: "another scheme", env: map[string]string{"NATS_URL": "http://n1:4222"}, err: `scheme "http"`},
		{name: "a bad flag", args: []string{"--nats-url", "nats://n1:4222,"}, err: `invalid --nats-url "nats://n1:4222,": server 2 of 2 is empty`},
		{name: "credentials", env: map[string]string{"QUILL_NATS_CREDS": f.creds}, opts: 1},
		{name: "unreadable credentials", env: map[string]string{"QUILL_NATS_CREDS": f.missing}, err: `invalid QUILL_NATS_CREDS "` + f.missing + `": open`},
		{name: "not credentials", env: map[string]string{"QUILL_NATS_CREDS": f.ca}, err: `not a NATS credentials file`},
		{name: "a CA", env: map[string]string{"QUILL_NATS_TLS_CA": f.ca}, opts: 1},
		{name: "an unreadable CA", env: map[string]string{"QUILL_NATS_TLS_CA": f.missing}, err: `invalid QUILL_NATS_TLS_CA`},
		{name: "a CA file without certificates", env: map[string]string{"QUILL_NATS_TLS_CA": f.junk}, err: `invalid QUILL_NATS_TLS_CA "` + f.junk + `": no PEM certificate in it`},
		{name: "a client certificate", env: map[string]string{"QUILL_NATS_TLS_CA": f.ca, "QUILL_NATS_TLS_CERT": f.cert, "QUILL_NATS_TLS_KEY": f.key}, opts: 2},
		{name: "a certificate without its key", env: map[string]string{"QUILL_NATS_TLS_CERT": f.cert}, err: `QUILL_NATS_TLS_CERT is set without QUILL_NATS_TLS_KEY`},
		{name: "a key without its certificate", args: []string{"--nats-tls-key", f.key}, err: `QUILL_NATS_TLS_KEY is set without QUILL_NATS_TLS_CERT`},
		{name: "a key of another certificate", env: map[string]string{"QUILL_NATS_TLS_CERT": f.cert, "QUILL_NATS_TLS_KEY": f.otherKey},
			err: `are not a certificate and its key`},
		{name: "an unreadable certificate", env: map[string]string{"QUILL_NATS_TLS_CERT": f.missing, "QUILL_NATS_TLS_KEY": f.key}, err: `invalid QUILL_NATS_TLS_CERT`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := parse(tc.env, tc.args...)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Len(t, c.Options(), tc.opts)
		})
	}
}

// Connect takes a cluster's server list and fails over to another node
// when the one it is connected to stops.
func TestConnectFailsOver(t *testing.T) {
	t.Parallel()
	cl := natstest.StartCluster(t, 3)
	c, err := parse(map[string]string{"NATS_URL": cl.URLs()})
	require.NoError(t, err)
	nc, err := c.Connect()
	require.NoError(t, err)
	defer nc.Close()
	first := nc.ConnectedUrl()
	for i := range 3 {
		if cl.URL(i) == first {
			cl.Stop(i)
		}
	}
	testkit.WaitFor(t, 30*time.Second, func() bool { return nc.IsConnected() && nc.ConnectedUrl() != first },
		"the connection to move to another node")
	require.NoError(t, nc.Flush())
}

// TestExplain: each refusal nats.go reports is wrapped with the setting it
// concerns, whichever way the timing made nats.go report it; other errors
// are returned as they are.
func TestExplain(t *testing.T) {
	t.Parallel()
	none := natsconn.Settings{}
	all := natsconn.Settings{Creds: "/c/user.creds", TLSCA: "/c/ca.pem", TLSCert: "/c/client.pem", TLSKey: "/c/client-key.pem"}
	unverified := fmt.Errorf("%w: %w", nats.ErrTLS, &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})
	alert := &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}
	closed := func(err error) error {
		return fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, err)
	}
	pipe := closed(&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)})
	reset := closed(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	eof := closed(io.EOF)
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	version := &net.OpError{Op: "remote error", Err: errors.New("tls: protocol version not supported")}
	timeout := fmt.Errorf("%w: %w", nats.ErrTLS, os.ErrDeadlineExceeded)
	for _, tc := range []struct {
		name string
		c    natsconn.Settings
		err  error
		want string // "" for err unchanged
	}{
		{name: "no server", c: all, err: nats.ErrNoServers},
		{name: "refused TCP", c: all, err: dial},
		{name: "a TLS timeout", c: all, err: timeout},
		{name: "an alert not about the certificate", c: all, err: version},
		{name: "unverified with the system's roots", c: none, err: unverified, want: "the system's roots do not verify the NATS server's certificate (QUILL_NATS_TLS_CA is not set): "},
		{name: "unverified with the CA", c: all, err: unverified, want: `QUILL_NATS_TLS_CA "/c/ca.pem" does not verify the NATS server's certificate: `},
		{name: "an alert without a certificate", c: none, err: alert, want: "(QUILL_NATS_TLS_CERT and QUILL_NATS_TLS_KEY are not set): "},
		{name: "an alert with a certificate", c: all, err: alert, want: `rejecting the client certificate QUILL_NATS_TLS_CERT "/c/client.pem": `},
		{name: "a broken pipe without a certificate", c: none, err: pipe, want: "(QUILL_NATS_TLS_CERT and QUILL_NATS_TLS_KEY are not set): "},
		{name: "a reset with a certificate", c: all, err: reset, want: `rejecting the client certificate QUILL_NATS_TLS_CERT "/c/client.pem": `},
		{name: "EOF with a certificate", c: all, err: eof, want: `rejecting the client certificate QUILL_NATS_TLS_CERT "/c/client.pem": `},
		{name: "authorization without credentials", c: none, err: nats.ErrAuthorization, want: "the NATS server requires credentials (QUILL_NATS_CREDS is not set): "},
		{name: "authorization with credentials", c: all, err: nats.ErrAuthorization, want: `the NATS server refused the credentials QUILL_NATS_CREDS "/c/user.creds": `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := tc.c.Explain(tc.err)
			if tc.want == "" {
				require.Equal(t, tc.err, got)
				return
			}
			require.ErrorIs(t, got, tc.err)
			require.Contains(t, got.Error(), tc.want+tc.err.Error())
		})
	}
	require.NoError(t, all.Explain(nil))
}

// TestRedact: every password and token of a NATS_URL value is taken out,
// in a list, without a scheme, and when the entry is no valid URL at all;
// the rest stays as written.
func TestRedact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
		secrets        []string // none of them may be left
	}{
		{name: "empty", in: "", want: ""},
		{name: "no user information", in: "nats://127.0.0.1:4222", want: "nats://127.0.0.1:4222"},
		{name: "a list without user information", in: "nats://n1:4222, n2:4222,tls://n3", want: "nats://n1:4222, n2:4222,tls://n3"},
		{name: "user and password", in: "nats://user:s3cret@host:4222", want: "nats://user:xxxxx@host:4222", secrets: []string{"s3cret"}},
		{name: "a token", in: "nats://t0ken@host", want: "nats://xxxxx@host", secrets: []string{"t0ken"}},
		{name: "a user only is a token", in: "tls://alice@host:4443", want: "tls://xxxxx@host:4443", secrets: []string{"alice"}},
		{name: "an empty password", in: "nats://user:@host", want: "nats://user:xxxxx@host"},
		{name: "no scheme", in: "user:s3cret@host:4222", want: "user:xxxxx@host:4222", secrets: []string{"s3cret"}},
		{name: "a token without a scheme", in: "t0ken@host", want: "xxxxx@host", secrets: []string{"t0ken"}},
		{name: "a comma-separated list", in: "nats://a:p4ss1@n1:4222, nats://t0ken2@n2:4222,n3:4222,b:p4ss3@n4",
			want: "nats://a:xxxxx@n1:4222, nats://xxxxx@n2:4222,n3:4222,b:xxxxx@n4", secrets: []string{"p4ss1", "t0ken2", "p4ss3"}},
		{name: "tokens without schemes", in: "t0ken1@n1, t0ken2@n2", want: "xxxxx@n1, xxxxx@n2", secrets: []string{"t0ken1", "t0ken2"}},
		{name: "websocket", in: "wss://user:s3cret@host/path", want: "wss://user:xxxxx@host/path", secrets: []string{"s3cret"}},
		{name: "a password with @", in: "nats://user:s3c@ret@host", want: "nats://user:xxxxx@host", secrets: []string{"s3c", "ret@"}},
		{name: "a password with a comma", in: "nats://user:s3c,ret@host", want: "nats://user:xxxxx@host", secrets: []string{"s3c", "ret"}},
		{name: "malformed: a bad escape", in: "nats://user:s3c%zzret@host:1", want: "nats://user:xxxxx@host:1", secrets: []string{"s3c", "zzret"}},
		{name: "malformed: a space", in: "nats://user:s3c ret@host", want: "nats://user:xxxxx@host", secrets: []string{"s3c", "ret"}},
		{name: "malformed: no host", in: "nats://user:s3cret@", want: "nats://user:xxxxx@", secrets: []string{"s3cret"}},
		{name: "malformed: a bad port", in: "nats://user:s3cret@host:http", want: "nats://user:xxxxx@host:http", secrets: []string{"s3cret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := natsconn.Redact(tc.in)
			require.Equal(t, tc.want, got)
			for _, s := range tc.secrets {
				require.NotContains(t, got, s)
			}
		})
	}
}

// A bad NATS_URL is refused naming the setting, with its passwords and
// tokens taken out of the message, and Servers never shows them.
func TestSettingsNeverShowTheURLsSecrets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url string
		args      []string
		err       string
	}{
		{name: "a bad port in a list", url: "nats://user:s3cret@n1:4222,nats://t0ken@n2:70000",
			err: `invalid NATS_URL "nats://user:xxxxx@n1:4222,nats://xxxxx@n2:70000": server 2 of 2 "nats://xxxxx@n2:70000": port "70000" is not 1 to 65535`},
		{name: "not a URL", url: "nats://user:s3c%zzret@n1:4222", err: `invalid NATS_URL "nats://user:xxxxx@n1:4222": "nats://user:xxxxx@n1:4222" is not a URL`},
		{name: "no host", url: "nats://user:s3cret@", err: `has no host`},
		{name: "another scheme", url: "http://user:s3cret@n1", err: `scheme "http"`},
		{name: "a bad flag", args: []string{"--nats-url", "nats://t0ken@n1:0"}, err: `invalid --nats-url "nats://xxxxx@n1:0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(map[string]string{"NATS_URL": tc.url}, tc.args...)
			require.ErrorContains(t, err, tc.err)
			for _, s := range []string{"s3cret", "s3c", "zzret", "t0ken"} {
				require.NotContains(t, err.Error(), s)
			}
			// Validate of settings made in code says the same.
			if tc.args == nil {
				err = natsconn.Settings{URL: tc.url}.Validate()
				require.Error(t, err)
				require.NotContains(t, err.Error(), "s3c")
			}
		})
	}
	c, err := parse(map[string]string{"NATS_URL": "nats://user:s3cret@n1:4222,t0ken@n2"})
	require.NoError(t, err)
	require.Equal(t, "nats://user:xxxxx@n1:4222,xxxxx@n2", c.Servers())
}

// Connect's errors, and Scrub's, hold no secret of NATS_URL, and still
// wrap nats.go's error.
func TestConnectErrorsHoldNoSecret(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // a port that refuses
	c := natsconn.Settings{URL: "nats://user:s3cret@" + addr + ",nats://t0ken@" + addr}
	_, err = c.Connect(nats.Timeout(2 * time.Second))
	require.ErrorIs(t, err, nats.ErrNoServers)
	require.NotContains(t, err.Error(), "s3cret")
	require.NotContains(t, err.Error(), "t0ken")

	quoted := fmt.Errorf("parse %q: %w", "nats://user:s3cret@host", nats.ErrBadTimeout)
	scrubbed := c.Scrub(quoted)
	require.Equal(t, `parse "nats://user:xxxxx@host": nats: timeout invalid`, scrubbed.Error())
	require.ErrorIs(t, scrubbed, nats.ErrBadTimeout)
	require.Same(t, nats.ErrNoServers, c.Scrub(nats.ErrNoServers), "an error without a secret is kept")
	require.NoError(t, c.Scrub(nil))
}
