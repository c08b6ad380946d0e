// Package natstest runs a real NATS server with JetStream in-process for
// tests, the way nats-server's and nats.go's own tests do: a fresh server on
// 127.0.0.1 with a random port (Port = -1), file storage in t.TempDir(), and
// shutdown in t.Cleanup. The server can be stopped and restarted on the same
// URL and store directory to simulate an outage: clients configured to
// reconnect find it again, and streams survive on disk. WithTLS and
// WithOperator start a server that requires what a production deployment
// may (SPEC §2): TLS with verified client certificates, and operator-mode
// JWT credentials. Test-only.
package natstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"
)

// readyTimeout bounds how long a (re)start may take before the test fails.
const readyTimeout = 10 * time.Second

// Option configures a Server started by Start.
type Option func(*config)

type config struct {
	maxPayload int32
	syncAlways bool
	storeDir   string
	tls        *PKI      // nil: plain TCP
	operator   *Operator // nil: no authentication
}

// clientOptions are the options a client needs to pass the server's TLS
// and authentication, for Probe and Connect.
func (c config) clientOptions() []nats.Option {
	var opts []nats.Option
	if c.tls != nil {
		opts = append(opts, nats.RootCAs(c.tls.CA), nats.ClientCert(c.tls.ClientCert, c.tls.ClientKey))
	}
	if c.operator != nil {
		opts = append(opts, nats.UserCredentials(c.operator.creds))
	}
	return opts
}

// WithMaxPayload sets the server's max_payload in bytes. Clients learn it on
// connect, and a publish larger than it fails with nats.ErrMaxPayload.
func WithMaxPayload(n int32) Option {
	return func(c *config) { c.maxPayload = n }
}

// WithSyncAlways makes JetStream fsync every write (sync_interval: always),
// as a production deployment that cannot lose acknowledged messages would.
func WithSyncAlways() Option {
	return func(c *config) { c.syncAlways = true }
}

// WithStoreDir sets the JetStream store directory instead of a fresh
// t.TempDir(), for example to start a second server on an earlier one's data.
func WithStoreDir(dir string) Option {
	return func(c *config) { c.storeDir = dir }
}

// tlsTimeout bounds the server's TLS handshake (nats-server's default is
// 2s; a loaded test machine needs more).
const tlsTimeout = 5 * time.Second

// PKI is a test public-key infrastructure as PEM files: a CA and, signed by
// it, a server certificate for 127.0.0.1 and localhost and a client
// certificate, each with its key.
type PKI struct {
	CA                    string // the CA certificate
	ServerCert, ServerKey string // the server's certificate and key
	ClientCert, ClientKey string // a client's certificate and key
}

// NewPKI generates a fresh CA, server certificate and client certificate
// (ECDSA P-256, valid from an hour ago for a day) into t.TempDir(). Two
// calls give two unrelated CAs, so one PKI's files are the wrong ones for
// another's server.
func NewPKI(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600), "natstest: write %s", name)
		return p
	}
	serial := int64(0)
	// issue makes a key and a certificate from tmpl, signed by parent's
	// key (self-signed when parent is nil), and writes both.
	issue := func(name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err, "natstest: %s key", name)
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.Subject = pkix.Name{CommonName: "natstest " + name}
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
		if parent == nil {
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		require.NoError(t, err, "natstest: %s certificate", name)
		cert, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(t, err)
		return cert, key, write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "PRIVATE KEY", keyDER)
	}
	ca, caKey, caFile, _ := issue("ca", &x509.Certificate{IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}, nil, nil)
	_, _, serverCert, serverKey := issue("server", &x509.Certificate{KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}, ca, caKey)
	_, _, clientCert, clientKey := issue("client", &x509.Certificate{KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, caKey)
	return PKI{CA: caFile, ServerCert: serverCert, ServerKey: serverKey, ClientCert: clientCert, ClientKey: clientKey}
}

// WithTLS makes the server require TLS with p's server certificate and
// verify every client's certificate against p.CA (tls { verify: true }):
// a client without a certificate, or one that does not trust p.CA, cannot
// connect. URL becomes tls://; Connect and the readiness probe present
// p's client certificate.
func WithTLS(p PKI) Option {
	return func(c *config) { c.tls = &p }
}

// Operator is a test NATS operator in operator (decentralised JWT) mode: a
// self-signed operator JWT, a system account and one account with
// JetStream enabled and no limits, all signed by the operator, and a user
// of that account whose credentials file Creds returns.
type Operator struct {
	claims  *jwt.OperatorClaims
	kp      nkeys.KeyPair // the operator's signing key
	sysPub  string
	preload map[string]string // account public key → account JWT, what the server trusts
	accKP   nkeys.KeyPair     // the JetStream account's key
	dir     string
	creds   string // a user of the JetStream account, for Connect and the probe
}

// NewOperator generates an operator, its system account and a JetStream
// account, and a user's credentials file for that account, into
// t.TempDir().
func NewOperator(t testing.TB) *Operator {
	t.Helper()
	okp, err := nkeys.CreateOperator()
	require.NoError(t, err, "natstest: operator key")
	opub, err := okp.PublicKey()
	require.NoError(t, err)
	o := &Operator{kp: okp, preload: map[string]string{}, dir: t.TempDir()}
	sysKP, sysJWT := o.account(t, "SYS", false)
	o.sysPub, err = sysKP.PublicKey()
	require.NoError(t, err)
	o.preload[o.sysPub] = sysJWT
	var accJWT string
	o.accKP, accJWT = o.account(t, "QUILL", true)
	accPub, err := o.accKP.PublicKey()
	require.NoError(t, err)
	o.preload[accPub] = accJWT

	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "natstest"
	oc.SystemAccount = o.sysPub
	ojwt, err := oc.Encode(okp)
	require.NoError(t, err, "natstest: operator JWT")
	// Decoded as the server decodes an operator JWT file.
	o.claims, err = jwt.DecodeOperatorClaims(ojwt)
	require.NoError(t, err)
	o.creds = o.userCreds(t, o.accKP, "quill")
	return o
}

// account creates an account signed by the operator, with JetStream
// unlimited when js, and returns its key and JWT.
func (o *Operator) account(t testing.TB, name string, js bool) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	require.NoError(t, err, "natstest: account key")
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	ac := jwt.NewAccountClaims(pub)
	ac.Name = name
	if js {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	j, err := ac.Encode(o.kp)
	require.NoError(t, err, "natstest: account JWT")
	return kp, j
}

// userCreds creates a user of the account whose key is acc and writes its
// credentials file (user JWT and NKey seed), returning the path.
func (o *Operator) userCreds(t testing.TB, acc nkeys.KeyPair, name string) string {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	require.NoError(t, err, "natstest: user key")
	upub, err := ukp.PublicKey()
	require.NoError(t, err)
	seed, err := ukp.Seed()
	require.NoError(t, err)
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	ujwt, err := uc.Encode(acc)
	require.NoError(t, err, "natstest: user JWT")
	b, err := jwt.FormatUserConfig(ujwt, seed)
	require.NoError(t, err)
	f, err := os.CreateTemp(o.dir, name+"-*.creds")
	require.NoError(t, err)
	_, err = f.Write(b)
	require.NoError(t, errors.Join(err, f.Close()), "natstest: write credentials")
	return f.Name()
}

// Creds returns the path of the JetStream account's user credentials file,
// what Connect and the readiness probe use.
func (o *Operator) Creds() string { return o.creds }

// UnknownAccountCreds writes the credentials file of a user of a new
// account that the operator signs but the server was not given (it is in
// no resolver), and returns its path: the server refuses it.
func (o *Operator) UnknownAccountCreds(t testing.TB) string {
	t.Helper()
	kp, _ := o.account(t, "UNKNOWN", true)
	return o.userCreds(t, kp, "stranger")
}

// WithOperator runs the server in operator mode trusting o: its accounts
// are preloaded into a memory resolver (as resolver: MEMORY with
// resolver_preload), its system account is the server's, and a client
// needs a user's credentials signed by one of them (Creds). Connect and the
// readiness probe use o.Creds().
func WithOperator(o *Operator) Option {
	return func(c *config) { c.operator = o }
}

// Server is an in-process NATS server with JetStream. It remembers its
// options, port and store directory, so Restart brings it back on the same
// URL with the same data. Its methods are safe for concurrent use.
type Server struct {
	t   testing.TB // owner: the server is stopped when t ends and logs to it
	cfg config
	url string // fixed at first start

	mu   sync.Mutex
	port int // -1 until the first start has chosen one
	ns   *server.Server
	log  *tLogger
}

// Start starts a JetStream-enabled server on 127.0.0.1 with a random free
// port, storing in t.TempDir() unless WithStoreDir says otherwise. The
// server logs to t only when testing.Verbose(). It is stopped when t ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.storeDir == "" {
		cfg.storeDir = t.TempDir()
	}
	s := &Server{t: t, cfg: cfg, port: -1}
	// Registered after t.TempDir's removal, so it runs before it.
	t.Cleanup(s.Stop)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startLocked(t)
	scheme := "nats"
	if cfg.tls != nil {
		scheme = "tls"
	}
	s.url = fmt.Sprintf("%s://127.0.0.1:%d", scheme, s.port)
	return s
}

// startLocked starts a new server instance on s.port (-1: a random one,
// which is then remembered) and waits until it accepts connections and
// JetStream answers. s.mu must be held.
func (s *Server) startLocked(t testing.TB) {
	t.Helper()
	opts := &server.Options{
		Host:                   "127.0.0.1",
		Port:                   s.port,
		NoLog:                  true,
		NoSigs:                 true,
		DisableShortFirstPing:  true,
		DisableJetStreamBanner: true,
		JetStream:              true,
		StoreDir:               s.cfg.storeDir,
		MaxPayload:             s.cfg.maxPayload,
		SyncAlways:             s.cfg.syncAlways,
	}
	if p := s.cfg.tls; p != nil {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: p.ServerCert, KeyFile: p.ServerKey,
			CaFile: p.CA, Verify: true, Timeout: tlsTimeout.Seconds()})
		require.NoError(t, err, "natstest: TLS configuration")
		opts.TLSConfig, opts.TLS, opts.TLSVerify, opts.TLSTimeout = tc, true, true, tlsTimeout.Seconds()
	}
	if o := s.cfg.operator; o != nil {
		opts.TrustedOperators = []*jwt.OperatorClaims{o.claims}
		opts.SystemAccount = o.sysPub
		// A fresh resolver each start, preloaded as resolver_preload does.
		res := &server.MemAccResolver{}
		for pub, j := range o.preload {
			require.NoError(t, res.Store(pub, j), "natstest: preload account %s", pub)
		}
		opts.AccountResolver = res
	}
	ns, err := server.NewServer(opts)
	require.NoError(t, err, "natstest: new server")
	var lg *tLogger
	if testing.Verbose() {
		lg = &tLogger{t: s.t}
		ns.SetLoggerV2(lg, false, false, false)
	}
	ns.Start()
	hostPort := net.JoinHostPort(opts.Host, fmt.Sprint(s.port))
	if !ns.ReadyForConnections(readyTimeout) {
		shutdown(ns, lg)
		require.FailNowf(t, "natstest: server not ready", "listening on %s (port taken?) within %s", hostPort, readyTimeout)
	}
	if !ns.JetStreamEnabled() {
		shutdown(ns, lg)
		require.FailNow(t, "natstest: JetStream did not start (see the server log with -v)")
	}
	if s.port < 0 {
		s.port = ns.Addr().(*net.TCPAddr).Port
	}
	s.ns, s.log = ns, lg
	// End to end: a client can reach the JetStream API (streams recovered).
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	err = probe(ctx, ns.ClientURL(), s.cfg.clientOptions()...)
	cancel()
	if err != nil {
		s.ns, s.log = nil, nil
		shutdown(ns, lg)
		require.NoError(t, err, "natstest: JetStream API not answering")
	}
}

// Probe connects to the server at url and asks the JetStream API for the
// account's information: it returns nil once JetStream answers, the
// connection or API error otherwise (also when ctx ends first).
func Probe(ctx context.Context, url string) error { return probe(ctx, url) }

// probe is Probe with the client options a TLS or operator-mode server
// requires.
func probe(ctx context.Context, url string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name("natstest-probe"), nats.Timeout(2 * time.Second)}, opts...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.AccountInfo(ctx)
	return err
}

func shutdown(ns *server.Server, lg *tLogger) {
	ns.Shutdown()
	ns.WaitForShutdown()
	if lg != nil {
		lg.close()
	}
}

// URL returns the client URL, nats://127.0.0.1:PORT (tls://127.0.0.1:PORT
// for a WithTLS server). It does not change across Restart.
func (s *Server) URL() string { return s.url }

// StoreDir returns the JetStream store directory.
func (s *Server) StoreDir() string { return s.cfg.storeDir }

// NATSServer returns the running *server.Server, or nil while stopped. A
// Restart replaces it.
func (s *Server) NATSServer() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns
}

// Stop shuts the server down and waits until it has: connections are cut,
// the port is closed, and the server's goroutines have ended. Stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns == nil {
		return
	}
	shutdown(s.ns, s.log)
	s.ns, s.log = nil, nil
}

// Restart stops the server if it is running and starts it again on the same
// port and store directory, returning once it accepts connections and
// JetStream is enabled with its streams recovered.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ns != nil {
		shutdown(s.ns, s.log)
		s.ns, s.log = nil, nil
	}
	s.startLocked(t)
}

// Connect connects to the server and returns the connection with a
// JetStream handle. The connection reconnects forever, retrying every 20ms
// (so it finds the server again after Restart); it presents the PKI's client
// certificate to a WithTLS server and the operator's credentials to a
// WithOperator one. opts are applied after these defaults and override
// them. It is closed when t ends.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return connect(t, s.url, append(s.cfg.clientOptions(), opts...)...)
}

// connect connects to url, a server or a cluster's server list, reconnecting
// forever every 20ms; opts are applied after these defaults and override
// them. The connection is closed when t ends.
func connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	require.NoError(t, err, "natstest: connect to %s", url)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

// StreamMessages returns every message of stream whose subject matches
// subjectFilter ("" for all), in sequence order, with headers (for example
// jetstream.MsgIDHeader, "Nats-Msg-Id"). Messages published after the call
// began are not included.
func StreamMessages(t testing.TB, js jetstream.JetStream, stream, subjectFilter string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err, "natstest: stream %q", stream)
	state := st.CachedInfo().State
	if state.Msgs == 0 {
		return nil
	}
	if subjectFilter == "" {
		subjectFilter = ">"
	}
	var msgs []*jetstream.RawStreamMsg
	for seq := state.FirstSeq; seq <= state.LastSeq; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subjectFilter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		require.NoError(t, err, "natstest: stream %q: message at or after %d on %q", stream, seq, subjectFilter)
		if m.Sequence > state.LastSeq {
			break
		}
		msgs = append(msgs, m)
		seq = m.Sequence + 1
	}
	return msgs
}

// tLogger sends a server's log to its test's log until closed: a server
// goroutine that logs after shutdown must not touch a finished test.
type tLogger struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (l *tLogger) logf(level, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.t.Logf("nats-server "+level+" "+format, v...)
	}
}

func (l *tLogger) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

func (l *tLogger) Noticef(format string, v ...any) { l.logf("[INF]", format, v...) }
func (l *tLogger) Warnf(format string, v ...any)   { l.logf("[WRN]", format, v...) }
func (l *tLogger) Fatalf(format string, v ...any)  { l.logf("[FTL]", format, v...) }
func (l *tLogger) Errorf(format string, v ...any)  { l.logf("[ERR]", format, v...) }
func (l *tLogger) Debugf(format string, v ...any)  { l.logf("[DBG]", format, v...) }
func (l *tLogger) Tracef(format string, v ...any)  { l.logf("[TRC]", format, v...) }
