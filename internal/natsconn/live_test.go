package natsconn_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/natstest"
)

// These tests connect as the processes do — settings parsed from the
// environment, validated, then Connect — to servers that require TLS with
// client certificates or operator-mode credentials, so a setting natsconn
// stopped applying fails them.

// connectTimeout bounds each connection attempt: a refused one fails in
// milliseconds, so this only matters on a stuck machine.
const connectTimeout = 3 * time.Second

// connect parses env as a process does and connects once, without
// reconnecting.
func connect(t *testing.T, env map[string]string) (*nats.Conn, error) {
	t.Helper()
	c, err := parse(env)
	require.NoError(t, err, "the settings are valid; the server decides")
	nc, err := c.Connect(nats.Name(t.Name()), nats.Timeout(connectTimeout), nats.NoReconnect())
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// roundTrip creates the memory stream named stream, publishes to it and
// reads the message back through a consumer: JetStream works for the
// connection's account.
func roundTrip(t *testing.T, nc *nats.Conn, stream string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	subject := "live." + stream
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err, "create stream %s", stream)
	ack, err := js.Publish(ctx, subject, []byte("hello "+stream))
	require.NoError(t, err)
	require.Equal(t, stream, ack.Stream)
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
	require.NoError(t, err)
	var got []string
	for m := range batch.Messages() {
		got = append(got, string(m.Data()))
		require.NoError(t, m.Ack())
	}
	require.NoError(t, batch.Error())
	require.Equal(t, []string{"hello " + stream}, got)
}

// TestTLS: against a server that requires TLS and verifies client
// certificates, the CA and the client certificate from QUILL_NATS_TLS_*
// connect and JetStream works; a missing client certificate, a CA that did
// not sign the server's certificate, or a client certificate the server's
// CA did not sign each fail with an error that says so.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki, other := natstest.NewPKI(t), natstest.NewPKI(t)
	srv := natstest.Start(t, natstest.WithTLS(pki))
	for i, tc := range []struct {
		name string
		url  string // "" for srv.URL(), tls://
		env  map[string]string
		err  []string // what the error says; none to connect
	}{
		{name: "the CA and a client certificate",
			env: map[string]string{"QUILL_NATS_TLS_CA": pki.CA, "QUILL_NATS_TLS_CERT": pki.ClientCert, "QUILL_NATS_TLS_KEY": pki.ClientKey}},
		// The client upgrades when the server's INFO requires TLS.
		{name: "a nats:// URL", url: strings.Replace(srv.URL(), "tls://", "nats://", 1),
			env: map[string]string{"QUILL_NATS_TLS_CA": pki.CA, "QUILL_NATS_TLS_CERT": pki.ClientCert, "QUILL_NATS_TLS_KEY": pki.ClientKey}},
		// The server asks for a certificate and the client has none.
		{name: "no client certificate", env: map[string]string{"QUILL_NATS_TLS_CA": pki.CA},
			err: []string{"refused the TLS connection", "QUILL_NATS_TLS_CERT and QUILL_NATS_TLS_KEY are not set"}},
		// The client does not trust the server's certificate.
		{name: "another CA",
			env: map[string]string{"QUILL_NATS_TLS_CA": other.CA, "QUILL_NATS_TLS_CERT": pki.ClientCert, "QUILL_NATS_TLS_KEY": pki.ClientKey},
			err: []string{`QUILL_NATS_TLS_CA "` + other.CA + `" does not verify the NATS server's certificate`, "certificate signed by unknown authority"}},
		{name: "the system's roots",
			env: map[string]string{"QUILL_NATS_TLS_CERT": pki.ClientCert, "QUILL_NATS_TLS_KEY": pki.ClientKey},
			err: []string{"QUILL_NATS_TLS_CA is not set", "certificate signed by unknown authority"}},
		// The server does not trust the client's certificate.
		{name: "a client certificate of another CA",
			env: map[string]string{"QUILL_NATS_TLS_CA": pki.CA, "QUILL_NATS_TLS_CERT": other.ClientCert, "QUILL_NATS_TLS_KEY": other.ClientKey},
			err: []string{"refused the TLS connection", `rejecting the client certificate QUILL_NATS_TLS_CERT "` + other.ClientCert + `"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.env["NATS_URL"] = srv.URL()
			if tc.url != "" {
				tc.env["NATS_URL"] = tc.url
			}
			nc, err := connect(t, tc.env)
			if tc.err != nil {
				refused(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.True(t, nc.TLSRequired())
			roundTrip(t, nc, fmt.Sprintf("TLS%d", i))
		})
	}
}

// refused requires err to say each of want.
func refused(t *testing.T, err error, want []string) {
	t.Helper()
	require.Error(t, err)
	t.Logf("refused: %v", err)
	for _, w := range want {
		require.ErrorContains(t, err, w)
	}
}

// TestCredentials: against a server in operator mode, the user credentials
// file in QUILL_NATS_CREDS connects to its account and JetStream works; no
// credentials, a user of an account the server does not know, and a user
// of another operator are each refused as an authorization violation.
func TestCredentials(t *testing.T) {
	t.Parallel()
	op := natstest.NewOperator(t)
	srv := natstest.Start(t, natstest.WithOperator(op))
	unknown, foreign := op.UnknownAccountCreds(t), natstest.NewOperator(t).Creds()
	for _, tc := range []struct {
		name string
		env  map[string]string
		err  []string // what the error says; none to connect
	}{
		{name: "a user of the account", env: map[string]string{"QUILL_NATS_CREDS": op.Creds()}},
		{name: "no credentials", env: map[string]string{},
			err: []string{"the NATS server requires credentials (QUILL_NATS_CREDS is not set)", "Authorization Violation"}},
		{name: "a user of an unknown account", env: map[string]string{"QUILL_NATS_CREDS": unknown},
			err: []string{`refused the credentials QUILL_NATS_CREDS "` + unknown + `"`, "Authorization Violation"}},
		{name: "a user of another operator", env: map[string]string{"QUILL_NATS_CREDS": foreign},
			err: []string{`refused the credentials QUILL_NATS_CREDS "` + foreign + `"`, "Authorization Violation"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.env["NATS_URL"] = srv.URL()
			nc, err := connect(t, tc.env)
			if tc.err != nil {
				refused(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			roundTrip(t, nc, "CREDS")
		})
	}
}

// TestTLSAndCredentials: all five settings together, against a server
// that requires both.
func TestTLSAndCredentials(t *testing.T) {
	t.Parallel()
	pki, op := natstest.NewPKI(t), natstest.NewOperator(t)
	srv := natstest.Start(t, natstest.WithTLS(pki), natstest.WithOperator(op))
	nc, err := connect(t, map[string]string{"NATS_URL": srv.URL(), "QUILL_NATS_CREDS": op.Creds(),
		"QUILL_NATS_TLS_CA": pki.CA, "QUILL_NATS_TLS_CERT": pki.ClientCert, "QUILL_NATS_TLS_KEY": pki.ClientKey})
	require.NoError(t, err)
	require.True(t, nc.TLSRequired())
	roundTrip(t, nc, "BOTH")
}
