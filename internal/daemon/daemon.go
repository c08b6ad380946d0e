// Package daemon is the start-up every Quill daemon (the api, the relay
// and the attachment worker) shares, written once. Main is their main:
// SIGINT and SIGTERM stop gracefully, SIGHUP is ignored (LogHangups logs
// it). Program is their command line: the daemon's command (run, the
// api's serve) with the shared Settings and the daemon's own, a warning
// for each removed setting still set, and the operator commands. Start
// builds the JSON logger, tracing, the PostgreSQL pool with its gauges and
// the NATS connection with its reconnect logs; Run serves the admin server
// (/healthz, /readyz, /metrics) and the daemon's own servers and runs its
// loops in an errgroup until the context ends, then shuts everything down
// in order — after QUILL_SHUTDOWN_DELAY, during which /readyz answers 503,
// when one is set; NotifyReady tells systemd when a daemon is ready and
// when it is stopping. Every daemon's probe command asks a running one's
// admin address whether it is ready, for health checks in an image
// without a shell. A daemon's Program.Start builds its services between Start
// and Run.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/tracing"
)

// ShutdownTimeout bounds a server's graceful shutdown: in-flight requests
// get this long to finish.
const ShutdownTimeout = 30 * time.Second

// ProvisionTimeout bounds a start-up step such as provisioning the stream.
const ProvisionTimeout = 10 * time.Second

// Settings are the settings every daemon shares.
type Settings struct {
	CommandSettings
	// NATS is how to reach NATS: NATS_URL (one URL or a cluster's server
	// list), QUILL_NATS_CREDS and QUILL_NATS_TLS_*.
	NATS natsconn.Settings
	// AdminAddr is the address of /healthz, /readyz and /metrics
	// (QUILL_ADMIN_ADDR).
	AdminAddr string
	// HTTP are the timeouts and connection cap of every HTTP server of
	// the daemon (QUILL_READ_TIMEOUT, QUILL_WRITE_TIMEOUT,
	// QUILL_IDLE_TIMEOUT, QUILL_MAX_CONNECTIONS, QUILL_TRUSTED_PROXIES);
	// zero fields take their defaults.
	HTTP httpserve.Settings
	// Pprof serves Go's runtime profiles on the admin address
	// (QUILL_PPROF, default false).
	Pprof bool
	// ShutdownDelay is how long a stopping daemon keeps serving, with
	// /readyz answering 503, before its shutdown begins
	// (QUILL_SHUTDOWN_DELAY, default 0): the time a load balancer or
	// Kubernetes needs to stop sending it new requests.
	ShutdownDelay time.Duration
	// NotifySocket is systemd's notification socket (NOTIFY_SOCKET), set
	// when the daemon runs as a Type=notify service: Run tells it when the
	// daemon is ready and when it is stopping. Empty otherwise.
	NotifySocket string
	// Getenv is the process's environment, for tracing's OTEL_* settings;
	// nil reads as empty (tracing off). Stdout is where tracing's console
	// exporter writes.
	Getenv func(string) string
	Stdout io.Writer
	// removed are the removed settings the environment still sets, which
	// Start warns about.
	removed []config.Removed
}

// Define registers the shared settings on s (DATABASE_URL, NATS_URL,
// QUILL_NATS_CREDS, QUILL_NATS_TLS_*, QUILL_ADMIN_ADDR, the HTTP servers'
// settings, QUILL_LOG_LEVEL, QUILL_PPROF); adminAddr is the process's
// default admin address, nats says what NATS is for (--help).
func (d *Settings) Define(s *config.Set, adminAddr, nats string) {
	s.String(&d.DatabaseURL, "database-url", "DATABASE_URL", db.DefaultURL, "PostgreSQL URL")
	d.NATS.Define(s, nats)
	s.String(&d.AdminAddr, "admin-addr", "QUILL_ADMIN_ADDR", adminAddr, "/healthz, /readyz and /metrics listen address")
	d.HTTP.Define(s)
	s.String(&d.LogLevel, "log-level", "QUILL_LOG_LEVEL", "info", "log level: trace, debug, info, warn, error")
	s.Bool(&d.Pprof, "pprof", "QUILL_PPROF", false, "serve Go's runtime profiles at /debug/pprof/ on the admin address")
	s.DurationOrZero(&d.ShutdownDelay, "shutdown-delay", "QUILL_SHUTDOWN_DELAY", 0,
		"on SIGTERM, keep serving this long with /readyz answering 503 before shutting down (deregistration from a load balancer); 0 shuts down at once")
}

// parse reads a daemon's settings, registered on s, from args and the
// environment; a daemon takes no positional arguments. It returns
// flag.ErrHelp for --help and a cli.UsageError for anything wrong.
func parse(s *config.Set, args []string) error {
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	if len(s.Args()) > 0 {
		return cli.UsageError{Msg: fmt.Sprintf("unexpected arguments: %q", s.Args())}
	}
	return nil
}

// CommandSettings are the settings of a daemon's operator commands (relay
// events, attachment-worker dead-letters), which need only the database.
type CommandSettings struct {
	// DatabaseURL is the PostgreSQL URL (DATABASE_URL); LogLevel the
	// logger's level (QUILL_LOG_LEVEL).
	DatabaseURL, LogLevel string
}

// Define registers DATABASE_URL and QUILL_LOG_LEVEL on s.
func (c *CommandSettings) Define(s *config.Set) {
	s.String(&c.DatabaseURL, "database-url", "DATABASE_URL", db.DefaultURL, "PostgreSQL URL")
	s.String(&c.LogLevel, "log-level", "QUILL_LOG_LEVEL", "info", "log level")
}

// Open builds an operator command's logger on stderr, named as the daemon
// name, and a pool of two connections. It returns a cli.UsageError for a
// bad log level and a cli.LoggedError (logged as one line) when PostgreSQL
// is not reachable. The caller closes the pool.
func (c CommandSettings) Open(ctx context.Context, name string, stderr io.Writer) (zerolog.Logger, *pgxpool.Pool, error) {
	log, err := logging.New(stderr, c.LogLevel, name)
	if err != nil {
		return log, nil, cli.UsageError{Msg: err.Error()}
	}
	pool, err := db.Open(ctx, c.DatabaseURL, 2)
	if err != nil {
		log.Error().Err(err).Str("error_category", "database_unreachable").Msg("PostgreSQL is not reachable at DATABASE_URL")
		return log, nil, cli.LoggedError{Err: err}
	}
	return log, pool, nil
}

// Process describes the daemon being started.
type Process struct {
	// Name is the process's name in its logs; its NATS connection is
	// named quill-<Name>.
	Name string
	// Service is the process's service.name in its traces (quill-api).
	Service string
	// PoolSize is the most PostgreSQL connections of the pool, unless
	// DATABASE_URL names pool_max_conns.
	PoolSize int32
	// WithoutNATS is for a daemon that serves without NATS (the API):
	// Start connects to none and Daemon.NATS is nil.
	WithoutNATS bool
	// Disconnected is the warning logged when the NATS connection is lost:
	// it says what happens meanwhile.
	Disconnected string
	// NATSOptions are applied to the NATS connection after the shared
	// ones (the relay's relay.ConnOptions).
	NATSOptions []nats.Option
}

// Daemon holds what Start opened, for the daemon's services to use.
type Daemon struct {
	Log      zerolog.Logger       // JSON on stderr, named after the process
	Pool     *pgxpool.Pool        // PostgreSQL, Process.PoolSize connections
	NATS     *nats.Conn           // reconnects forever; nil WithoutNATS
	Registry *prometheus.Registry // served on /metrics by Run, with the pool's gauges

	tracing       *tracing.Provider
	adminAddr     string
	pprof         bool
	http          httpserve.Settings
	notifySocket  string
	shutdownDelay time.Duration
}

// Start builds the logger on stderr, warns about removed settings the
// environment still sets, starts tracing and opens the pool and the NATS
// connection, which reconnects forever once made. It returns a
// cli.UsageError for bad NATS or tracing settings (before anything is
// written) or a bad log level, and a cli.LoggedError (logged as one line
// with its error_category) when PostgreSQL or NATS is not reachable; then
// nothing stays open. The caller must Close the Daemon.
func Start(ctx context.Context, s Settings, p Process, stderr io.Writer) (*Daemon, error) {
	if err := s.NATS.Validate(); err != nil {
		return nil, cli.UsageError{Msg: err.Error()}
	}
	log, err := logging.New(stderr, s.LogLevel, p.Name)
	if err != nil {
		return nil, cli.UsageError{Msg: err.Error()}
	}
	for _, r := range s.removed {
		log.Warn().Str("setting", r.Env).Str("fixed", r.Fixed).Msg("a removed setting is set: it is ignored, the value is fixed; unset it")
	}
	getenv := s.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	stdout := s.Stdout
	if stdout == nil {
		stdout = io.Discard
	}
	tp, err := tracing.Start(ctx, getenv, tracing.Process{Service: p.Service, Stdout: stdout}, log)
	if err != nil {
		return nil, cli.UsageError{Msg: err.Error()}
	}
	pool, err := db.Open(ctx, s.DatabaseURL, p.PoolSize)
	if err != nil {
		tp.Stop(log)
		log.Error().Err(err).Str("error_category", "database_unreachable").Msg("cannot start: PostgreSQL is not reachable at DATABASE_URL")
		return nil, cli.LoggedError{Err: err}
	}
	d := &Daemon{Log: log, Pool: pool, Registry: metrics.NewRegistry(), tracing: tp,
		adminAddr: s.AdminAddr, http: s.HTTP, notifySocket: s.NotifySocket, pprof: s.Pprof, shutdownDelay: s.ShutdownDelay}
	d.Registry.MustRegister(metrics.NewPoolCollector(metrics.PoolMain, pool))
	if p.WithoutNATS {
		return d, nil
	}
	// A server list is a cluster: the client fails over to the next
	// server, and to those the cluster announces, keeping its
	// subscriptions; the durable consumer and the outbox keep the position.
	opts := []nats.Option{nats.Name("quill-" + p.Name), nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second), nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				return // our own Close at shutdown
			}
			log.Warn().Err(s.NATS.Scrub(err)).Str("error_category", "nats_disconnected").Msg(p.Disconnected)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			// nats.go's ConnectedUrlRedacted keeps a token (a user
			// name without a password): Redact takes it out too.
			log.Info().Str("server", natsconn.Redact(nc.ConnectedUrl())).Msg("NATS connection restored")
		}),
	}
	// Connect explains a refusal by the setting it concerns (decision
	// 0044) and scrubs NATS_URL's secrets from its error.
	if d.NATS, err = s.NATS.Connect(append(opts, p.NATSOptions...)...); err != nil {
		d.Close()
		log.Error().Err(err).Str("error_category", "nats_unreachable").Msg("cannot start: NATS is not reachable at NATS_URL")
		return nil, cli.LoggedError{Err: err}
	}
	return d, nil
}

// Tracer is the daemon's tracer: a no-op one when tracing is off.
func (d *Daemon) Tracer() trace.Tracer { return d.tracing.Tracer() }

// Close sends the spans not exported yet, then closes the NATS connection
// and the pool.
func (d *Daemon) Close() {
	d.tracing.Stop(d.Log)
	if d.NATS != nil {
		d.NATS.Close()
	}
	d.Pool.Close()
}

// Provision runs a start-up step (provisioning the stream or a consumer),
// bounded by ProvisionTimeout. A failure is logged as one line, msg with
// category as its error_category, and returned as a cli.LoggedError.
func (d *Daemon) Provision(ctx context.Context, category, msg string, step func(context.Context) error) error {
	pctx, cancel := context.WithTimeout(ctx, ProvisionTimeout)
	defer cancel()
	if err := step(pctx); err != nil {
		d.Log.Error().Err(err).Str("error_category", category).Msg(msg)
		return cli.LoggedError{Err: err}
	}
	return nil
}

// Services are what Run runs.
type Services struct {
	// Ready are /readyz's checks, and systemd's readiness.
	Ready map[string]metrics.ReadyFunc
	// Admin, when set, wraps the admin handler (/healthz, /readyz,
	// /metrics): the API mounts its console with it.
	Admin func(http.Handler) http.Handler
	// Servers are HTTP servers beside the admin server (the API's), with
	// its timeouts and connection cap.
	Servers []Server
	// Loops are the daemon's work; they run until ctx ends.
	Loops []func(context.Context) error
	// Trailing run beside the others, but their context ends only once
	// the servers and the loops returned, so that work finishing during
	// the shutdown (a write's wake-up of the relays, a replay counted)
	// still reaches them.
	Trailing []func(context.Context) error
}

// Server is an HTTP server Run serves.
type Server struct {
	Name, Addr string
	Handler    http.Handler
}

// Run listens on the admin address and the servers' and runs the services
// until ctx ends or one of them fails; with a ShutdownDelay, the end of ctx
// first turns /readyz to 503 ("stopping") and the shutdown begins the
// delay later, while everything keeps serving. Then it shuts the servers down —
// new connections are refused, requests in flight get ShutdownTimeout to
// finish —, waits for the loops, then stops the trailing services and logs
// "stopped". Under systemd (Settings.NotifySocket) it reports READY=1 once
// the ready checks pass and STOPPING=1 when the shutdown begins
// (NotifyReady); a SIGHUP is logged and ignored (LogHangups). It returns
// the first service's or server's error, or a cli.LoggedError when an
// address cannot be listened on (then nothing ran).
func (d *Daemon) Run(ctx context.Context, s Services) error {
	ctx, ready, stop := d.delayShutdown(ctx, s.Ready)
	defer stop()
	s.Ready = ready
	admin := metrics.AdminHandler(d.Log, d.Registry, s.Ready)
	if s.Admin != nil {
		admin = s.Admin(admin)
	}
	if d.pprof {
		admin = metrics.WithProfiling(admin)
	}
	type listening struct {
		name string
		srv  *http.Server
		ln   net.Listener
	}
	var servers []listening
	for _, sv := range append([]Server{{Name: "admin", Addr: d.adminAddr, Handler: admin}}, s.Servers...) {
		ln, err := d.http.Listen(sv.Addr)
		if err != nil {
			for _, l := range servers {
				l.ln.Close()
			}
			d.Log.Error().Err(err).Str("listener", sv.Name).Msg("cannot listen on the " + sv.Name + " address")
			return cli.LoggedError{Err: fmt.Errorf("listen %s: %w", sv.Name, err)}
		}
		servers = append(servers, listening{sv.Name, ln.Server(sv.Handler), ln})
		d.Log.Info().Str("listener", sv.Name).Str("addr", ln.Addr().String()).Msg("listening")
	}
	defer LogHangups(d.Log)()

	g, gctx := errgroup.WithContext(ctx)
	tctx, stopTrailing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTrailing()
	var leading sync.WaitGroup
	lead := func(run func() error) {
		leading.Add(1)
		g.Go(func() error { defer leading.Done(); return run() })
	}
	for _, l := range servers {
		lead(func() error { return Serve(gctx, l.name, l.srv, l.ln) })
	}
	lead(func() error { return NotifyReady(gctx, d.Log, d.notifySocket, s.Ready) })
	for _, run := range s.Loops {
		lead(func() error { return run(gctx) })
	}
	for _, run := range s.Trailing {
		g.Go(func() error { return run(tctx) })
	}
	g.Go(func() error { leading.Wait(); stopTrailing(); return nil })
	err := g.Wait()
	d.Log.Info().Msg("stopped")
	return err
}

// delayShutdown returns the context Run serves under — ctx itself without
// a ShutdownDelay, else one that ends the delay after ctx does — and the
// ready checks with one more that fails from the moment ctx ends, so that
// a load balancer stops sending requests before the servers stop taking
// them. stop releases the delay's timer.
func (d *Daemon) delayShutdown(ctx context.Context, checks map[string]metrics.ReadyFunc) (context.Context, map[string]metrics.ReadyFunc, func()) {
	if d.shutdownDelay <= 0 {
		return ctx, checks, func() {}
	}
	ready := make(map[string]metrics.ReadyFunc, len(checks)+1)
	maps.Copy(ready, checks)
	stopping := ctx
	ready["shutdown"] = func(context.Context) error {
		if stopping.Err() != nil {
			return &metrics.NotReadyError{Reason: "stopping"}
		}
		return nil
	}
	// The signal's context ends; the services' ends the delay later.
	delayed, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var timer *time.Timer
	var mu sync.Mutex
	unhook := context.AfterFunc(ctx, func() {
		d.Log.Info().Dur("shutdown_delay", d.shutdownDelay).Msg("stopping: /readyz answers 503; the shutdown begins after QUILL_SHUTDOWN_DELAY")
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(d.shutdownDelay, cancel)
	})
	return delayed, ready, func() {
		unhook()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// Serve serves srv on ln until ctx ends, then shuts it down: new
// connections are refused and in-flight requests get ShutdownTimeout to
// finish. It returns the server's failure, wrapped with name, or the
// shutdown's.
func Serve(ctx context.Context, name string, srv *http.Server, ln net.Listener) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("%s server: %w", name, err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), ShutdownTimeout)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	return g.Wait()
}
