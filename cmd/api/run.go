package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/console"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/tracing"
)

const overview = `usage: api [serve] [flags]     run the HTTP API (default)
       api migrate [flags]     create the database if missing and apply migrations
       api token create --tenant T    print a new bearer token for tenant T
       api token create --operator --name NAME
                                      print a new operator token (the console's sign-in)
       api token revoke TOKEN_PREFIX  revoke a token (its qt_xxxxxxxx prefix, or the token)
       api console rotate-key [--end-sessions]
                                      a new session key for the operator console
       api token revoked [--since TIME]
                                      list the tokens revoked since TIME (RFC 3339): prefix, time
       api audit [--tenant T [--key K]] [--json]
                               reconcile operations, notes, events, stream and inbox;
                               exit 0 consistent, 1 anomalies, 3 incomplete

Run "api <command> --help" for a command's settings.`

// Defaults of the API's settings (SPEC §2).
const (
	defaultHTTPAddr   = ":8080"
	defaultAdminAddr  = ":9090"
	defaultLogLevel   = "info"
	defaultDBMaxConns = 16
	// defaultTokenCacheTTL spares a query per request; a revoked token is
	// refused within it.
	defaultTokenCacheTTL = 5 * time.Second
)

// run is the whole program: main only wires signals and the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return cli.Dispatch(ctx, "api", overview, "serve", map[string]cli.RunFunc{
		"serve":   serve,
		"migrate": migrate,
		"token":   token,
		"console": consoleCmd,
		"audit":   auditCmd,
	}, args, getenv, stdout, stderr)
}

// common settings of every subcommand.
type common struct {
	databaseURL string
	logLevel    string
}

func (c *common) define(s *config.Set) {
	s.String(&c.databaseURL, "database-url", "DATABASE_URL", db.DefaultURL, "PostgreSQL URL")
	s.String(&c.logLevel, "log-level", "QUILL_LOG_LEVEL", defaultLogLevel, "log level: trace, debug, info, warn, error")
}

type serveConfig struct {
	common
	httpAddr, adminAddr                   string
	responseRetention, keyRetention, wait time.Duration
	maxBody, maxAttachment, dbMaxConns    int
	tokenCacheTTL                         time.Duration
	replayCacheBytes                      int
	http                                  httpserve.Settings
	maxConcurrency, tenantConcurrency     int
	tenantRate                            float64
	tenantBurst                           int
	lockTimeout, acquireTimeout           time.Duration
	console                               consoleSettings
	pprof                                 bool
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var c serveConfig
	s := config.New("api serve", "usage: api serve [flags]\n\nRuns the HTTP API.", getenv, stdout)
	c.define(s)
	s.String(&c.httpAddr, "http-addr", "QUILL_HTTP_ADDR", defaultHTTPAddr, "API listen address")
	s.String(&c.adminAddr, "admin-addr", "QUILL_ADMIN_ADDR", defaultAdminAddr, "/healthz, /readyz and /metrics listen address")
	s.Duration(&c.responseRetention, "idempotency-retention", "QUILL_IDEMPOTENCY_RETENTION", notes.DefaultResponseRetention, "how long a completed operation's response is replayed")
	s.Duration(&c.keyRetention, "key-retention", "QUILL_KEY_RETENTION", notes.DefaultKeyRetention, "how long a key is remembered at all (tombstone); at least the response retention")
	s.Duration(&c.wait, "idempotency-wait", "QUILL_IDEMPOTENCY_WAIT", notes.DefaultWait, "how long a request waits for a concurrent one with the same key")
	s.Int(&c.maxBody, "max-body-bytes", "QUILL_MAX_BODY_BYTES", httpapi.DefaultMaxBodyBytes, 1, "request body limit")
	s.Int(&c.maxAttachment, "max-attachment-bytes", "QUILL_MAX_ATTACHMENT_BYTES", httpapi.DefaultMaxAttachmentBytes, 0, "decoded attachment limit")
	s.Int(&c.dbMaxConns, "db-max-conns", "QUILL_DB_MAX_CONNS", defaultDBMaxConns, 2, "PostgreSQL connection pool size")
	s.Int(&c.replayCacheBytes, "replay-cache-bytes", "QUILL_REPLAY_CACHE_BYTES", notes.DefaultReplayCacheBytes, 0, "memory for recently committed operation records that answer replays without a database round trip (0 disables)")
	s.DurationOrZero(&c.tokenCacheTTL, "token-cache-ttl", "QUILL_TOKEN_CACHE_TTL", defaultTokenCacheTTL, "how long a valid token's tenant is remembered; a revocation takes effect within it (0 disables)")
	c.http.Define(s)
	s.Int(&c.maxConcurrency, "max-concurrency", "QUILL_MAX_CONCURRENCY", httpapi.DefaultMaxConcurrency, 1, "requests the API works on at once; past it a request is answered 429 before its body is read")
	s.Int(&c.tenantConcurrency, "tenant-concurrency", "QUILL_TENANT_CONCURRENCY", httpapi.DefaultTenantConcurrency, 1, "requests the API works on at once for one tenant; past it 429")
	s.Func("tenant-rate", "QUILL_TENANT_RATE", "0", "requests per second one tenant may send, such as 50 or 0.5 (0: no rate limit); past it 429, before the body is read", func(v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e6 {
			return fmt.Errorf("%q is not a number of requests per second from 0 to 1000000", v)
		}
		c.tenantRate = f
		return nil
	})
	s.Int(&c.tenantBurst, "tenant-burst", "QUILL_TENANT_BURST", 0, 0, "requests one tenant may send at once past QUILL_TENANT_RATE's pace (0: one second's worth, at least 1)")
	s.Duration(&c.lockTimeout, "lock-timeout", "QUILL_LOCK_TIMEOUT", notes.DefaultLockTimeout, "longest a write waits for a row lock another transaction holds (a worker's batch); then 503, retry with the same key")
	c.console.define(s)
	s.Bool(&c.pprof, "pprof", "QUILL_PPROF", false, "serve Go's runtime profiles at /debug/pprof/ on the admin address")
	s.Duration(&c.acquireTimeout, "db-acquire-timeout", "QUILL_DB_ACQUIRE_TIMEOUT", notes.DefaultAcquireTimeout, "longest a request waits for a free PostgreSQL connection of the pool; then 503")
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	if len(s.Args()) > 0 {
		return cli.UsageError{Msg: fmt.Sprintf("unexpected arguments: %q", s.Args())}
	}
	if c.responseRetention <= 0 {
		return cli.UsageError{Msg: "QUILL_IDEMPOTENCY_RETENTION must be positive"}
	}
	if err := c.console.nats.Validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	if c.keyRetention < c.responseRetention {
		return cli.UsageError{Msg: fmt.Sprintf("QUILL_KEY_RETENTION (%s) must be at least QUILL_IDEMPOTENCY_RETENTION (%s): a key must be remembered for as long as its response", c.keyRetention, c.responseRetention)}
	}
	log, err := logging.New(stderr, c.logLevel, "api")
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	tp, err := tracing.Start(ctx, getenv, tracing.Process{Service: "quill-api", Stdout: stdout}, log)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	defer tp.Stop(log)

	pool, err := db.Open(ctx, c.databaseURL, int32(c.dbMaxConns))
	if err != nil {
		log.Error().Err(err).Str("error_category", "database_unreachable").Msg("cannot start: PostgreSQL is not reachable at DATABASE_URL")
		return cli.LoggedError{Err: fmt.Errorf("start: %w", err)}
	}
	defer pool.Close()

	reg := metrics.NewRegistry()
	reg.MustRegister(metrics.NewPoolCollector(metrics.PoolMain, pool))
	m := metrics.NewAPI(reg, contract.Actions()...)
	notifier := outbox.NewNotifier(pool, func(err error) {
		log.Warn().Err(err).Str("error_category", "notify_failed").Msg("could not wake the relays; they will poll")
	})
	if c.replayCacheBytes == 0 {
		c.replayCacheBytes = -1 // notes.Config reads 0 as "the default"
	}
	svc, err := notes.NewService(pool, notes.Config{
		ResponseRetention: c.responseRetention, KeyRetention: c.keyRetention, Wait: c.wait,
		ReplayCacheBytes: c.replayCacheBytes, LockTimeout: c.lockTimeout, AcquireTimeout: c.acquireTimeout,
	}, log, notes.WithObserver(m), notes.WithNotifier(notifier))
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	api := httpapi.NewServer(httpapi.Deps{Pool: pool, Auth: auth.NewAuthenticator(pool, c.tokenCacheTTL),
		Notes: svc, Log: log, Metrics: m, Tracer: tp.Tracer(),
		Config: httpapi.Config{MaxBodyBytes: int64(c.maxBody), MaxAttachmentBytes: c.maxAttachment,
			MaxConcurrency: c.maxConcurrency, TenantConcurrency: c.tenantConcurrency,
			TenantRate: c.tenantRate, TenantBurst: c.tenantBurst}})
	ready := map[string]metrics.ReadyFunc{"postgres": metrics.PingReady(pool)}
	admin := metrics.AdminHandler(log, reg, ready)
	c.console.proxies = console.TrustedProxies(c.http.TrustedProxies)
	con, closeConsole, err := newConsole(&c.console, pool, log, audit.Config{
		ResponseRetention: c.responseRetention, KeyRetention: c.keyRetention})
	if err != nil {
		log.Error().Err(err).Str("error_category", "console_failed").Msg("cannot start the operator console")
		return cli.LoggedError{Err: fmt.Errorf("start: %w", err)}
	}
	defer closeConsole()
	if con != nil {
		admin = con.Mount(admin)
	}
	if c.pprof {
		admin = metrics.WithProfiling(admin)
	}

	g, gctx := errgroup.WithContext(ctx)
	// The notifier and the replay counter outlive the HTTP servers so that
	// writes finishing during shutdown still wake the relays and replays
	// answered during it are still written (a final flush on stop).
	nctx, stopNotifier := context.WithCancel(context.WithoutCancel(ctx))
	g.Go(func() error { return notifier.Run(nctx) })
	g.Go(func() error { return svc.RunReplayCounter(nctx) })
	g.Go(func() error {
		defer stopNotifier()
		return serveHTTP(gctx, log, c.http, map[string]server{
			"api":   {addr: c.httpAddr, handler: api},
			"admin": {addr: c.adminAddr, handler: admin},
		}, func(ctx context.Context) error {
			return daemon.NotifyReady(ctx, log, getenv(daemon.NotifySocketEnv), ready)
		})
	})
	return g.Wait()
}

type server struct {
	addr    string
	handler http.Handler
}

// serveHTTP runs the servers until ctx ends, then shuts them down: new
// connections are refused, in-flight requests finish (writes run detached
// from their clients, so a commit under way completes). Once every server
// listens it runs notify (systemd's readiness) beside them; a SIGHUP
// meanwhile is logged and ignored.
//
// Every server has hs's timeouts, header limit and connection cap.
func serveHTTP(ctx context.Context, log zerolog.Logger, hs httpserve.Settings, servers map[string]server, notify func(context.Context) error) error {
	defer daemon.LogHangups(log)()
	g, gctx := errgroup.WithContext(ctx)
	for name, s := range servers {
		ln, err := hs.Listen(s.addr)
		if err != nil {
			log.Error().Err(err).Str("listener", name).Msg("cannot listen")
			return cli.LoggedError{Err: fmt.Errorf("listen %s: %w", name, err)}
		}
		srv := ln.Server(s.handler)
		log.Info().Str("listener", name).Str("addr", ln.Addr().String()).Msg("listening")
		g.Go(func() error { return daemon.Serve(gctx, name, srv, ln) })
	}
	g.Go(func() error { return notify(gctx) })
	err := g.Wait()
	log.Info().Msg("stopped")
	return err
}

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var c common
	s := config.New("api migrate", "usage: api migrate [flags]\n\nCreates the database when it is missing (and the role may) and applies the embedded migrations. Safe to run from several processes at once.", getenv, stdout)
	c.define(s)
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	log, err := logging.New(stderr, c.logLevel, "api")
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	res, err := db.Migrate(ctx, c.databaseURL)
	if errors.Is(err, db.ErrTransactionPooler) {
		return cli.UsageError{Msg: err.Error()}
	}
	if err != nil {
		log.Error().Err(err).Str("error_category", "migrate_failed").Msg("migration failed")
		return cli.LoggedError{Err: err}
	}
	log.Info().Bool("created_database", res.CreatedDatabase).Strs("applied", res.Applied).Int64("version", res.Version).Msg("database migrated")
	return nil
}

func token(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: api token create --tenant T | api token create --operator --name NAME | api token revoke TOKEN_PREFIX | api token revoked [--since TIME]"
	if len(args) == 0 {
		return cli.UsageError{Msg: usage}
	}
	sub, args := args[0], args[1:]
	var c common
	var tenant, name, since string
	var operator bool
	s := config.New("api token "+sub, usage, getenv, stdout)
	c.define(s)
	if sub == "create" {
		s.FlagSet().StringVar(&tenant, "tenant", "", "tenant the token acts for ("+contract.TenantPattern+")")
		s.FlagSet().BoolVar(&operator, "operator", false, "make an operator token (qo_…) for the operator console instead of a tenant's")
		s.FlagSet().StringVar(&name, "name", "", "with --operator: who holds the token, as the console's log lines name them")
	}
	if sub == "revoked" {
		s.FlagSet().StringVar(&since, "since", "", "list revocations at or after this time (RFC 3339, such as 2026-05-01T12:00:00Z); default all")
	}
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	log, err := logging.New(stderr, c.logLevel, "api")
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	var sinceTime time.Time
	switch sub {
	case "create":
		if len(s.Args()) > 0 {
			return cli.UsageError{Msg: fmt.Sprintf("unexpected arguments %q; %s", s.Args(), usage)}
		}
		switch {
		case operator && tenant != "":
			return cli.UsageError{Msg: "--operator and --tenant exclude each other: an operator token acts for no tenant; " + usage}
		case operator && name == "":
			return cli.UsageError{Msg: "--operator needs --name (who holds the token); " + usage}
		case operator && !auth.ValidOperatorName(name):
			return cli.UsageError{Msg: fmt.Sprintf("%v: %q", auth.ErrInvalidOperatorName, name)}
		case !operator && name != "":
			return cli.UsageError{Msg: "--name is for --operator tokens; " + usage}
		case !operator && tenant == "":
			return cli.UsageError{Msg: "--tenant is required; " + usage}
		}
		if !operator && !contract.ValidTenant(tenant) {
			return cli.UsageError{Msg: fmt.Sprintf("%v: %q", auth.ErrInvalidTenant, tenant)}
		}
	case "revoke":
		if len(s.Args()) != 1 {
			return cli.UsageError{Msg: usage}
		}
		if _, err := auth.PrefixOf(s.Args()[0]); err != nil {
			return cli.UsageError{Msg: err.Error()}
		}
	case "revoked":
		if len(s.Args()) > 0 {
			return cli.UsageError{Msg: fmt.Sprintf("unexpected arguments %q; %s", s.Args(), usage)}
		}
		if since != "" {
			if sinceTime, err = time.Parse(time.RFC3339, since); err != nil {
				return cli.UsageError{Msg: fmt.Sprintf("--since %q is not an RFC 3339 time such as 2026-05-01T12:00:00Z", since)}
			}
		}
	default:
		return cli.UsageError{Msg: fmt.Sprintf("unknown token command %q; %s", sub, usage)}
	}
	pool, err := db.Open(ctx, c.databaseURL, 2)
	if err != nil {
		log.Error().Err(err).Str("error_category", "database_unreachable").Msg("PostgreSQL is not reachable at DATABASE_URL")
		return cli.LoggedError{Err: err}
	}
	defer pool.Close()
	if sub == "create" {
		var tok string
		if operator {
			tok, err = auth.CreateOperator(ctx, pool, name, time.Now())
		} else {
			tok, err = auth.Create(ctx, pool, tenant, time.Now())
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, tok)
		return nil
	}
	if sub == "revoked" {
		revs, err := auth.RevokedSince(ctx, pool, sinceTime)
		if err != nil {
			return err
		}
		for _, r := range revs {
			fmt.Fprintf(stdout, "%s\t%s\n", r.Prefix, r.RevokedAt.UTC().Format(time.RFC3339Nano))
		}
		return nil
	}
	if err := auth.Revoke(ctx, pool, s.Args()[0], time.Now()); err != nil {
		return err
	}
	log.Info().Str("prefix", s.Args()[0][:11]).Msg("token revoked")
	return nil
}
