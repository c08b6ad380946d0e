// Package daemon is the start-up every Quill daemon shares. Main is the
// main of the api, the relay and the attachment worker: SIGINT and SIGTERM
// stop gracefully, SIGHUP is ignored (LogHangups logs it). For the relay
// and the worker it also holds their command line (Program) and settings,
// the JSON logger, the PostgreSQL pool, the NATS connection with its
// reconnect logs, the admin server (/healthz, /readyz, /metrics) and the
// errgroup that runs the daemon's services until the context ends, then
// shuts everything down; NotifyReady tells systemd when a daemon is ready
// and when it is stopping. A daemon's Program.Start builds its services
// between Start and Run.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natsconn"
)

// DefaultNATSURL is the NATS server used when NATS_URL is not set.
const DefaultNATSURL = natsconn.DefaultURL

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
	// HTTP are the admin server's timeouts and connection cap
	// (QUILL_READ_TIMEOUT, QUILL_WRITE_TIMEOUT, QUILL_IDLE_TIMEOUT,
	// QUILL_MAX_CONNECTIONS); zero fields take their defaults.
	HTTP httpserve.Settings
	// Pprof serves Go's runtime profiles on the admin address
	// (QUILL_PPROF, default false).
	Pprof bool
	// NotifySocket is systemd's notification socket (NOTIFY_SOCKET), set
	// when the daemon runs as a Type=notify service: Run tells it when the
	// daemon is ready and when it is stopping. Empty otherwise.
	NotifySocket string
}

// Define registers the shared settings on s (DATABASE_URL, NATS_URL,
// QUILL_NATS_CREDS, QUILL_NATS_TLS_*, QUILL_ADMIN_ADDR, the HTTP server's
// QUILL_READ_TIMEOUT, QUILL_WRITE_TIMEOUT, QUILL_IDLE_TIMEOUT and
// QUILL_MAX_CONNECTIONS, QUILL_LOG_LEVEL); adminAddr is the process's
// default admin address.
func (d *Settings) Define(s *config.Set, adminAddr string) {
	s.String(&d.DatabaseURL, "database-url", "DATABASE_URL", db.DefaultURL, "PostgreSQL URL")
	d.NATS.Define(s, "NATS with JetStream")
	s.String(&d.AdminAddr, "admin-addr", "QUILL_ADMIN_ADDR", adminAddr, "/healthz, /readyz and /metrics listen address")
	d.HTTP.Define(s)
	s.String(&d.LogLevel, "log-level", "QUILL_LOG_LEVEL", "info", "log level: trace, debug, info, warn, error")
	s.Bool(&d.Pprof, "pprof", "QUILL_PPROF", false, "serve Go's runtime profiles at /debug/pprof/ on the admin address")
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
	// PoolSize is the most PostgreSQL connections of the pool.
	PoolSize int32
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
	NATS     *nats.Conn           // reconnects forever
	Registry *prometheus.Registry // served on /metrics by Run

	adminAddr    string
	pprof        bool
	http         httpserve.Settings
	notifySocket string
}

// Start builds the logger on stderr and opens the pool and the NATS
// connection, which reconnects forever once made. It returns a
// cli.UsageError for bad NATS settings (before anything is written) or a
// bad log level, and a cli.LoggedError (logged as one
// line with its error_category) when PostgreSQL or NATS is not reachable;
// then nothing stays open. The caller must Close the Daemon.
func Start(ctx context.Context, s Settings, p Process, stderr io.Writer) (*Daemon, error) {
	if err := s.NATS.Validate(); err != nil {
		return nil, cli.UsageError{Msg: err.Error()}
	}
	log, err := logging.New(stderr, s.LogLevel, p.Name)
	if err != nil {
		return nil, cli.UsageError{Msg: err.Error()}
	}
	pool, err := db.Open(ctx, s.DatabaseURL, p.PoolSize)
	if err != nil {
		log.Error().Err(err).Str("error_category", "database_unreachable").Msg("cannot start: PostgreSQL is not reachable at DATABASE_URL")
		return nil, cli.LoggedError{Err: err}
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
	nc, err := s.NATS.Connect(append(opts, p.NATSOptions...)...)
	if err != nil {
		pool.Close()
		log.Error().Err(err).Str("error_category", "nats_unreachable").Msg("cannot start: NATS is not reachable at NATS_URL")
		return nil, cli.LoggedError{Err: err}
	}
	return &Daemon{Log: log, Pool: pool, NATS: nc, Registry: metrics.NewRegistry(), adminAddr: s.AdminAddr, http: s.HTTP, notifySocket: s.NotifySocket, pprof: s.Pprof}, nil
}

// Close closes the NATS connection and the pool.
func (d *Daemon) Close() {
	d.NATS.Close()
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

// Run serves the admin address, with ready as /readyz's checks, and runs
// services until ctx ends or one of them fails; then it shuts the admin
// server down, waits for every service to return and logs "stopped". Under
// systemd (Settings.NotifySocket) it reports READY=1 once ready's checks
// pass and STOPPING=1 when the shutdown begins (NotifyReady); a SIGHUP is
// logged and ignored (LogHangups). It returns the first service's or
// server's error, or a cli.LoggedError when the admin address cannot be
// listened on (then nothing ran).
func (d *Daemon) Run(ctx context.Context, ready map[string]metrics.ReadyFunc, services ...func(context.Context) error) error {
	ln, err := d.http.Listen(d.adminAddr)
	if err != nil {
		d.Log.Error().Err(err).Msg("cannot listen on the admin address")
		return cli.LoggedError{Err: err}
	}
	handler := metrics.AdminHandler(d.Log, d.Registry, ready)
	if d.pprof {
		handler = metrics.WithProfiling(handler)
	}
	admin := ln.Server(handler)
	d.Log.Info().Str("listener", "admin").Str("addr", ln.Addr().String()).Msg("listening")
	defer LogHangups(d.Log)()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return Serve(gctx, "admin", admin, ln) })
	g.Go(func() error { return NotifyReady(gctx, d.Log, d.notifySocket, ready) })
	for _, run := range services {
		g.Go(func() error { return run(gctx) })
	}
	err = g.Wait()
	d.Log.Info().Msg("stopped")
	return err
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
