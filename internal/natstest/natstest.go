// Package natstest runs a real NATS server with JetStream in-process for
// tests, the way nats-server's and nats.go's own tests do: a fresh server on
// 127.0.0.1 with a random port (Port = -1), file storage in t.TempDir(), and
// shutdown in t.Cleanup. The server can be stopped and restarted on the same
// URL and store directory to simulate an outage: clients configured to
// reconnect find it again, and streams survive on disk. Test-only.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	s.url = fmt.Sprintf("nats://127.0.0.1:%d", s.port)
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
	err = Probe(ctx, ns.ClientURL())
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
func Probe(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Name("natstest-probe"), nats.Timeout(2*time.Second))
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

// URL returns the client URL, nats://127.0.0.1:PORT. It does not change
// across Restart.
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
// (so it finds the server again after Restart); opts are applied after these
// defaults and override them. It is closed when t ends.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{
		nats.Name(t.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
	}, opts...)
	nc, err := nats.Connect(s.url, all...)
	require.NoError(t, err, "natstest: connect to %s", s.url)
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
