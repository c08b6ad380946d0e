package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/retention"
	"github.com/quillhq/quill/internal/stream"
)

const overview = `usage: relay [run] [flags]           publish committed outbox events to JetStream (default)
       relay events list --parked [--json]  list parked events
       relay events retry ID                return a parked event to the queue

Run "relay run --help" for the settings.`

const (
	defaultAdminAddr = ":9091"
	shutdownTimeout  = 30 * time.Second
)

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return cli.Dispatch(ctx, "relay", overview, "run", map[string]cli.RunFunc{
		"run":    daemon,
		"events": events,
	}, args, getenv, stdout, stderr)
}

type settings struct {
	cli.Daemon
	relay     relay.Config
	retention retention.Config
}

func define(s *config.Set, c *settings) {
	c.Daemon.Define(s, defaultAdminAddr)
	r := &c.relay
	r.Stream.Define(s, true)
	s.Duration(&r.Lease, "lease", "QUILL_RELAY_LEASE", relay.DefaultLease, "how long PostgreSQL keeps the claims of a relay whose connection went silent (a relay that exits loses them at once)")
	s.Duration(&r.PollInterval, "poll-interval", "QUILL_RELAY_POLL_INTERVAL", relay.DefaultPollInterval, "polling fallback when notifications are lost")
	s.Duration(&r.MaxBackoff, "max-backoff", "QUILL_RELAY_MAX_BACKOFF", relay.DefaultMaxBackoff, "longest backoff while NATS or PostgreSQL fail")
	s.Int(&r.Batch, "batch", "QUILL_RELAY_BATCH", relay.DefaultBatch, 1, "events claimed per pass")
	s.Duration(&c.retention.OutboxRetention, "outbox-retention", "QUILL_OUTBOX_RETENTION", retention.DefaultOutboxRetention, "how long published events stay in the outbox")
	s.Duration(&c.retention.InboxRetention, "inbox-retention", "QUILL_INBOX_RETENTION", retention.DefaultInboxRetention, "how long consumers remember processed event ids; at least the stream's MaxAge")
}

func daemon(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var c settings
	s := config.New("relay run", "usage: relay [run] [flags]\n\nPublishes committed outbox events to NATS JetStream and runs the retention cleanup.", getenv, stdout)
	define(s, &c)
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	if len(s.Args()) > 0 {
		return cli.UsageError{Msg: fmt.Sprintf("unexpected arguments: %q", s.Args())}
	}
	cfg, rcfg := c.relay.WithDefaults(), c.retention.WithDefaults()
	for _, check := range []func() error{cfg.Validate, func() error { return rcfg.CoversStream(cfg.Stream) }, rcfg.Validate} {
		if err := check(); err != nil {
			return cli.UsageError{Msg: err.Error()}
		}
	}
	log, err := logging.New(stderr, c.LogLevel, "relay")
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	pool, err := db.Open(ctx, c.DatabaseURL, 8)
	if err != nil {
		log.Error().Err(err).Str("error_category", "database_unreachable").Msg("cannot start: PostgreSQL is not reachable at DATABASE_URL")
		return cli.LoggedError{Err: err}
	}
	defer pool.Close()
	nc, err := nats.Connect(c.NATSURL, nats.Name("quill-relay"), nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second), nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				return // our own Close at shutdown
			}
			log.Warn().Err(err).Str("error_category", "nats_disconnected").Msg("NATS connection lost; events wait in the outbox")
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info().Msg("NATS connection restored") }))
	if err != nil {
		log.Error().Err(err).Str("error_category", "nats_unreachable").Msg("cannot start: NATS is not reachable at NATS_URL")
		return cli.LoggedError{Err: err}
	}
	defer nc.Close()

	reg := metrics.NewRegistry()
	r, err := relay.New(pool, nc, cfg, log, metrics.NewRelay(reg))
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	cleaner, err := retention.New(pool, rcfg, log)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = r.Provision(pctx)
	cancel()
	if err != nil {
		log.Error().Err(err).Str("error_category", "stream_provisioning_failed").Msg("cannot start: the stream could not be created or updated")
		return cli.LoggedError{Err: err}
	}
	log.Info().Str("stream", cfg.Stream.Name).Str("subjects", stream.All(cfg.Stream.SubjectPrefix)).Dur("duplicate_window", cfg.Stream.DuplicateWindow).
		Dur("max_age", cfg.Stream.MaxAge).Msg("stream provisioned")

	ln, err := net.Listen("tcp", c.AdminAddr)
	if err != nil {
		log.Error().Err(err).Msg("cannot listen on the admin address")
		return cli.LoggedError{Err: err}
	}
	admin := &http.Server{Handler: metrics.AdminHandler(reg, map[string]metrics.ReadyFunc{"relay": r.Ready}), ReadHeaderTimeout: 10 * time.Second}
	log.Info().Str("listener", "admin").Str("addr", ln.Addr().String()).Msg("listening")

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := admin.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), shutdownTimeout)
		defer cancel()
		return admin.Shutdown(sctx)
	})
	g.Go(func() error { return r.Run(gctx) })
	g.Go(func() error { return cleaner.Run(gctx) })
	err = g.Wait()
	log.Info().Msg("stopped")
	return err
}

func events(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: relay events list --parked [--json] | relay events retry ID | relay events retry --all"
	if len(args) == 0 {
		return cli.UsageError{Msg: usage}
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	var databaseURL, logLevel string
	var parked, asJSON, all bool
	s := config.New("relay events "+sub, usage, getenv, stdout)
	s.String(&databaseURL, "database-url", "DATABASE_URL", db.DefaultURL, "PostgreSQL URL")
	s.String(&logLevel, "log-level", "QUILL_LOG_LEVEL", "info", "log level")
	if sub == "list" {
		s.FlagSet().BoolVar(&parked, "parked", false, "list parked events (the only listing so far)")
		s.FlagSet().BoolVar(&asJSON, "json", false, "one JSON object per line")
	}
	if sub == "retry" {
		s.FlagSet().BoolVar(&all, "all", false, "return every parked event to the queue (after fixing a cause that parked many)")
	}
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	var id uuid.UUID
	switch sub {
	case "list":
		if !parked || len(s.Args()) > 0 {
			return cli.UsageError{Msg: usage}
		}
	case "retry":
		if all != (len(s.Args()) == 0) || len(s.Args()) > 1 {
			return cli.UsageError{Msg: usage}
		}
		if !all {
			var err error
			if id, err = uuid.Parse(s.Args()[0]); err != nil {
				return cli.UsageError{Msg: fmt.Sprintf("%q is not an event id (a UUID)", s.Args()[0])}
			}
		}
	default:
		return cli.UsageError{Msg: fmt.Sprintf("unknown events command %q; %s", sub, usage)}
	}
	log, err := logging.New(stderr, logLevel, "relay")
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	pool, err := db.Open(ctx, databaseURL, 2)
	if err != nil {
		log.Error().Err(err).Str("error_category", "database_unreachable").Msg("PostgreSQL is not reachable at DATABASE_URL")
		return cli.LoggedError{Err: err}
	}
	defer pool.Close()
	if sub == "retry" && all {
		n, err := outbox.UnparkAll(ctx, pool)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d events returned to the queue (parked ones, and unpublished ones missing from it)\n", n)
		return nil
	}
	if sub == "retry" {
		if err := outbox.Unpark(ctx, pool, id); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "event %s returned to the queue; a relay publishes it on its next pass\n", id)
		return nil
	}
	list, err := outbox.ListParked(ctx, pool)
	if err != nil {
		return err
	}
	for _, p := range list {
		if asJSON {
			b, err := json.Marshal(p)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, string(b))
			continue
		}
		fmt.Fprintf(stdout, "%s  %s.%s  note %s  created %s  parked %s  attempts %d  reason: %s\n", p.ID,
			p.Tenant, p.Type, p.NoteID, p.CreatedAt.UTC().Format(time.RFC3339), p.ParkedAt.UTC().Format(time.RFC3339), p.Attempts, p.Reason)
	}
	if len(list) == 0 && !asJSON {
		fmt.Fprintln(stdout, "no parked events")
	}
	return nil
}
