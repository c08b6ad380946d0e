package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/console"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/webhooks"
	"github.com/quillhq/quill/internal/whsecret"
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
       api probe [--live]      exit 0 when the running API is ready (alive): a health check

Run "api <command> --help" for a command's settings.`

// Defaults of the API's settings (SPEC §2), and the values of its removed
// settings (decision 0076).
const (
	defaultHTTPAddr  = ":8080"
	defaultAdminAddr = ":9090"
	// poolSize is the API's PostgreSQL pool unless DATABASE_URL names
	// pool_max_conns (it was QUILL_DB_MAX_CONNS).
	poolSize = 16
	// tokenCacheTTL spares a query per request; a revoked token is
	// refused within it (it was QUILL_TOKEN_CACHE_TTL).
	tokenCacheTTL = 5 * time.Second
)

// removed are the API's settings that decision 0076 fixed, with their
// values; one still set in the environment is a warning at start-up.
var removed = []config.Removed{
	{Env: "QUILL_DB_MAX_CONNS", Fixed: "16, or pool_max_conns in DATABASE_URL"},
	{Env: "QUILL_DB_ACQUIRE_TIMEOUT", Fixed: idempotency.DefaultAcquireTimeout.String()},
	{Env: "QUILL_LOCK_TIMEOUT", Fixed: idempotency.DefaultLockTimeout.String()},
	{Env: "QUILL_REPLAY_CACHE_BYTES", Fixed: strconv.Itoa(idempotency.DefaultReplayCacheBytes)},
	{Env: "QUILL_TOKEN_CACHE_TTL", Fixed: tokenCacheTTL.String()},
	{Env: "QUILL_TENANT_BURST", Fixed: "one second of QUILL_TENANT_RATE, at least 1"},
}

// run is the whole program: main only wires signals and the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var c serveSettings
	return daemon.Program{
		Name:      "api",
		Command:   "serve",
		Overview:  overview,
		About:     "Runs the HTTP API.",
		AdminAddr: defaultAdminAddr,
		NATS:      "NATS with JetStream, for the operator console only (stream checks, dead-letter retries); the API serves without it",
		Removed:   removed,
		Define:    c.define,
		Start:     c.start,
		Commands: map[string]cli.RunFunc{
			"migrate": migrate,
			"token":   token,
			"console": consoleCmd,
			"audit":   auditCmd,
		},
	}.Main(ctx, args, getenv, stdout, stderr)
}

// serveSettings are api serve's own settings, besides daemon.Settings.
type serveSettings struct {
	httpAddr                              string
	responseRetention, keyRetention, wait time.Duration
	maxBody, maxAttachment                int
	maxConcurrency, tenantConcurrency     int
	tenantRate                            float64
	// webhookKeys seal the webhook endpoints' secrets; nil when
	// QUILL_WEBHOOK_SECRET_KEY is unset (the webhook routes answer 503).
	webhookKeys         *whsecret.Keys
	webhookAllowPrivate bool
	// writeGroup: creates travel through a db.Group (decision 0103).
	writeGroup bool
	console    consoleSettings
}

func (c *serveSettings) define(s *config.Set) {
	s.String(&c.httpAddr, "http-addr", "QUILL_HTTP_ADDR", defaultHTTPAddr, "API listen address")
	s.Duration(&c.responseRetention, "idempotency-retention", "QUILL_IDEMPOTENCY_RETENTION", idempotency.DefaultResponseRetention, "how long a completed operation's response is replayed")
	s.Duration(&c.keyRetention, "key-retention", "QUILL_KEY_RETENTION", idempotency.DefaultKeyRetention, "how long a key is remembered at all (tombstone); at least the response retention")
	s.Duration(&c.wait, "idempotency-wait", "QUILL_IDEMPOTENCY_WAIT", idempotency.DefaultWait, "how long a request waits for a concurrent one with the same key")
	s.Int(&c.maxBody, "max-body-bytes", "QUILL_MAX_BODY_BYTES", httpapi.DefaultMaxBodyBytes, 1, "request body limit")
	s.Int(&c.maxAttachment, "max-attachment-bytes", "QUILL_MAX_ATTACHMENT_BYTES", httpapi.DefaultMaxAttachmentBytes, 0, "decoded attachment limit")
	s.Int(&c.maxConcurrency, "max-concurrency", "QUILL_MAX_CONCURRENCY", httpapi.DefaultMaxConcurrency, 1, "requests the API works on at once; past it a request is answered 429 before its body is read")
	s.Int(&c.tenantConcurrency, "tenant-concurrency", "QUILL_TENANT_CONCURRENCY", httpapi.DefaultTenantConcurrency, 1, "requests the API works on at once for one tenant; past it 429")
	s.Func("tenant-rate", "QUILL_TENANT_RATE", "0", "requests per second one tenant may send, such as 50 or 0.5 (0: no rate limit), in bursts of one second's worth; past it 429, before the body is read", func(v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e6 {
			return fmt.Errorf("%q is not a number of requests per second from 0 to 1000000", v)
		}
		c.tenantRate = f
		return nil
	})
	s.FuncRedacted("webhook-secret-key", whsecret.KeyEnv, "", "the keys webhook secrets are sealed under: base64 of 32 bytes, or a comma-separated list (the first seals, each opens); keep them with the database credentials, not in the database. Unset: the webhook routes answer 503 webhooks_not_configured",
		func(v string) string {
			if v == "" {
				return ""
			}
			return "(redacted)"
		}, func(v string) error {
			if v == "" {
				c.webhookKeys = nil
				return nil
			}
			keys, err := whsecret.ParseKeys(v)
			if err != nil {
				return err // names the key by its position, never its value
			}
			c.webhookKeys = keys
			return nil
		})
	s.Bool(&c.webhookAllowPrivate, "webhook-allow-private", "QUILL_WEBHOOK_ALLOW_PRIVATE", false, "accept webhook endpoints on http and on private, loopback and link-local addresses (development and tests only)")
	s.Bool(&c.writeGroup, "write-group", "QUILL_WRITE_GROUP", true, "carry concurrent creates' transactions in one pipelined write and its reply, each with its own Sync (false: each create's transaction in a round trip of its own)")
	c.console.define(s)
}

func (c *serveSettings) start(ctx context.Context, ds daemon.Settings, stderr io.Writer) error {
	if c.responseRetention <= 0 {
		return cli.UsageError{Msg: "QUILL_IDEMPOTENCY_RETENTION must be positive"}
	}
	if c.keyRetention < c.responseRetention {
		return cli.UsageError{Msg: fmt.Sprintf("QUILL_KEY_RETENTION (%s) must be at least QUILL_IDEMPOTENCY_RETENTION (%s): a key must be remembered for as long as its response", c.keyRetention, c.responseRetention)}
	}
	d, err := daemon.Start(ctx, ds, daemon.Process{Name: "api", Service: "quill-api", PoolSize: poolSize, WithoutNATS: true}, stderr)
	if err != nil {
		return err
	}
	defer d.Close()
	log, pool := d.Log, d.Pool
	m := metrics.NewAPI(d.Registry, contract.Actions()...)
	notifier := outbox.NewNotifier(pool, func(err error) {
		log.Warn().Err(err).Str("error_category", "notify_failed").Msg("could not wake the relays; they will poll")
	})
	opts := []notes.Option{notes.WithObserver(m), notes.WithNotifier(notifier)}
	if c.writeGroup {
		group, err := db.NewGroup(pool, db.CreateGroupConfig(pool.Config().MaxConns))
		if err != nil {
			return cli.LoggedError{Err: fmt.Errorf("start: %w", err)}
		}
		// Deferred after the daemon's Close, so run before it: once the
		// HTTP server has drained, before the pool closes.
		defer group.Close()
		opts = append(opts, notes.WithGroup(group))
	}
	svc, err := notes.NewService(pool, notes.Config{
		ResponseRetention: c.responseRetention, KeyRetention: c.keyRetention, Wait: c.wait,
	}, log, opts...)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	if c.webhookKeys == nil {
		log.Warn().Str("error_category", "webhooks_not_configured").
			Msg(whsecret.KeyEnv + " is not set: the webhook routes answer 503 webhooks_not_configured")
	}
	wh, err := webhooks.NewService(pool, notes.Config{
		ResponseRetention: c.responseRetention, KeyRetention: c.keyRetention, Wait: c.wait,
	}, c.webhookKeys, log, webhooks.WithObserver(m), webhooks.WithRules(webhooks.Rules{AllowPrivate: c.webhookAllowPrivate}),
		webhooks.WithTurns(svc.Turn))
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	api := httpapi.NewServer(httpapi.Deps{Pool: pool, Auth: auth.NewAuthenticator(pool, tokenCacheTTL),
		Notes: svc, Webhooks: wh, Log: log, Metrics: m, Tracer: d.Tracer(),
		Config: httpapi.Config{MaxBodyBytes: int64(c.maxBody), MaxAttachmentBytes: c.maxAttachment,
			MaxConcurrency: c.maxConcurrency, TenantConcurrency: c.tenantConcurrency, TenantRate: c.tenantRate}})
	c.console.nats, c.console.proxies = ds.NATS, console.TrustedProxies(ds.HTTP.TrustedProxies)
	con, closeConsole, err := newConsole(&c.console, pool, log, audit.Config{
		ResponseRetention: c.responseRetention, KeyRetention: c.keyRetention})
	if err != nil {
		log.Error().Err(err).Str("error_category", "console_failed").Msg("cannot start the operator console")
		return cli.LoggedError{Err: fmt.Errorf("start: %w", err)}
	}
	defer closeConsole()
	services := daemon.Services{
		Ready:   map[string]metrics.ReadyFunc{"postgres": metrics.PingReady(pool)},
		Servers: []daemon.Server{{Name: "api", Addr: c.httpAddr, Handler: api}},
		// The notifier and the replay counter outlive the HTTP servers so
		// that writes finishing during shutdown still wake the relays and
		// replays answered during it are still written (a final flush).
		Trailing: []func(context.Context) error{notifier.Run, svc.RunReplayCounter, wh.RunReplayCounter},
	}
	if con != nil {
		services.Admin = con.Mount
	}
	return d.Run(ctx, services)
}

func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var c daemon.CommandSettings
	s := config.New("api migrate", "usage: api migrate [flags]\n\nCreates the database when it is missing (and the role may) and applies the embedded migrations. Safe to run from several processes at once.", getenv, stdout)
	c.Define(s)
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	log, err := logging.New(stderr, c.LogLevel, "api")
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	// The consumer package's tables first: the attachment worker's inbox
	// and dead letters live there (migration 00014 moves them in).
	res, err := db.Migrate(ctx, c.DatabaseURL, func(ctx context.Context, p *pgxpool.Pool) error { return consumer.Migrate(ctx, p) })
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
	var c daemon.CommandSettings
	var tenant, name, since string
	var operator bool
	s := config.New("api token "+sub, usage, getenv, stdout)
	c.Define(s)
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
	var sinceTime time.Time
	var err error
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
	log, pool, err := c.Open(ctx, "api", stderr)
	if err != nil {
		return err
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
