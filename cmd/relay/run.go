package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/retention"
)

const overview = `usage: relay [run] [flags]           publish committed outbox events to JetStream (default)
       relay events list --parked [--json]  list parked events
       relay events retry ID                return a parked event to the queue
       relay probe [--live]                 exit 0 when the running relay is ready (alive): a health check

Run "relay run --help" for the settings.`

// defaultAdminAddr is the relay's admin address (SPEC §2).
const defaultAdminAddr = ":9091"

// removed are the relay's settings that decision 0076 fixed, with their
// values (package relay's constants); one still set in the environment is
// a warning at start-up.
var removed = []config.Removed{
	{Env: "QUILL_RELAY_BATCH", Fixed: strconv.Itoa(relay.DefaultBatch)},
	{Env: "QUILL_RELAY_LEASE", Fixed: relay.DefaultLease.String()},
	{Env: "QUILL_RELAY_POLL_INTERVAL", Fixed: relay.DefaultPollInterval.String()},
	{Env: "QUILL_RELAY_MAX_BACKOFF", Fixed: relay.DefaultMaxBackoff.String()},
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runWith(ctx, args, getenv, stdout, stderr, relay.Config{})
}

// runWith is run with the relay's timings and batch taken from timings
// where they are set, package relay's constants elsewhere: the in-process
// tests shorten them, the program never does (they are not settings).
func runWith(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, timings relay.Config) error {
	c := settings{relay: timings}
	return daemon.Program{
		Name:      "relay",
		Overview:  overview,
		About:     "Publishes committed outbox events to NATS JetStream and runs the retention cleanup.",
		AdminAddr: defaultAdminAddr,
		Removed:   removed,
		Define:    c.define,
		Start:     c.start,
		Commands:  map[string]cli.RunFunc{"events": events},
	}.Main(ctx, args, getenv, stdout, stderr)
}

// settings are the relay's own settings, besides daemon.Settings.
type settings struct {
	// relay's Stream comes from the settings; its timings and batch are
	// runWith's.
	relay     relay.Config
	retention retention.Config
	// sessionURL is the claim and LISTEN sessions' URL
	// (QUILL_RELAY_DATABASE_URL); empty means DATABASE_URL.
	sessionURL string
}

func (c *settings) define(s *config.Set) {
	s.String(&c.sessionURL, "relay-database-url", "QUILL_RELAY_DATABASE_URL", "", "PostgreSQL URL of the claim and LISTEN sessions: direct or a session pooler, never a transaction pooler (default: DATABASE_URL)")
	c.relay.Stream.Define(s)
	s.Duration(&c.retention.OutboxRetention, "outbox-retention", "QUILL_OUTBOX_RETENTION", retention.DefaultOutboxRetention, "how long published events stay in the outbox")
	s.Duration(&c.retention.InboxRetention, "inbox-retention", "QUILL_INBOX_RETENTION", retention.DefaultInboxRetention, "how long consumers remember processed event ids; at least the stream's MaxAge")
}

func (c *settings) start(ctx context.Context, ds daemon.Settings, stderr io.Writer) error {
	cfg, rcfg := c.relay.WithDefaults(), c.retention.WithDefaults()
	for _, check := range []func() error{cfg.Validate, func() error { return rcfg.CoversStream(cfg.Stream) }, rcfg.Validate} {
		if err := check(); err != nil {
			return cli.UsageError{Msg: err.Error()}
		}
	}
	d, err := daemon.Start(ctx, ds, daemon.Process{Name: "relay", Service: "quill-relay", PoolSize: 8,
		Disconnected: "NATS connection lost; events wait in the outbox", NATSOptions: relay.ConnOptions()}, stderr)
	if err != nil {
		return err
	}
	defer d.Close()
	log := d.Log
	session, err := c.session(ctx, d, ds.DatabaseURL)
	if err != nil {
		return err
	}
	r, err := relay.New(d.Pool, d.NATS, cfg, log, metrics.NewRelay(d.Registry), relay.WithSessionConfig(session), relay.WithTracer(d.Tracer()))
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	cleaner, err := retention.New(d.Pool, rcfg, log)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	if err := d.Provision(ctx, "stream_provisioning_failed", "cannot start: the stream could not be created or updated", r.Provision); err != nil {
		return err
	}
	log.Info().Str("stream", cfg.Stream.Name).Str("subjects", contract.AllSubjects(cfg.Stream.SubjectPrefix)).Dur("duplicate_window", cfg.Stream.DuplicateWindow).
		Dur("max_age", cfg.Stream.MaxAge).Int("replicas", r.StreamReplicas()).Msg("stream provisioned")
	return d.Run(ctx, daemon.Services{Ready: map[string]metrics.ReadyFunc{"relay": r.Ready}, Loops: []func(context.Context) error{r.Run, cleaner.Run}})
}

// session returns the configuration of the relay's claim and LISTEN
// sessions, after making sure their URL (QUILL_RELAY_DATABASE_URL, else
// databaseURL) keeps a session: a transaction pooler is a usage error
// naming the setting (exit 2), an unreachable server one logged line
// (exit 1). Nothing is written either way.
func (c *settings) session(ctx context.Context, d *daemon.Daemon, databaseURL string) (*pgx.ConnConfig, error) {
	name, u := "QUILL_RELAY_DATABASE_URL", c.sessionURL
	if u == "" {
		name, u = "DATABASE_URL (the relay's session connection, as QUILL_RELAY_DATABASE_URL is unset)", databaseURL
	}
	cc, err := pgx.ParseConfig(u)
	if err != nil {
		return nil, cli.UsageError{Msg: fmt.Sprintf("invalid QUILL_RELAY_DATABASE_URL: %v", err)}
	}
	pctx, cancel := context.WithTimeout(ctx, daemon.ProvisionTimeout)
	defer cancel()
	route, err := db.ProbeRoute(pctx, cc)
	if err != nil {
		d.Log.Error().Err(err).Str("error_category", "database_unreachable").Msg("cannot start: PostgreSQL is not reachable at " + name)
		return nil, cli.LoggedError{Err: err}
	}
	if route == db.RouteTransactionPooler {
		return nil, cli.UsageError{Msg: fmt.Sprintf("%s %v", name, db.ErrTransactionPooler)}
	}
	d.Log.Info().Str("route", route.String()).Msg("claim session checked")
	return cc, nil
}

func events(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: relay events list --parked [--json] | relay events retry ID | relay events retry --all"
	sub, args, ok, err := cli.Subcommand("relay", args, usage, stdout)
	if !ok {
		return err
	}
	var c daemon.CommandSettings
	var parked, asJSON, all bool
	s := config.New("relay events "+sub, usage, getenv, stdout)
	c.Define(s)
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
			if id, err = uuid.Parse(s.Args()[0]); err != nil {
				return cli.UsageError{Msg: fmt.Sprintf("%q is not an event id (a UUID)", s.Args()[0])}
			}
		}
	default:
		return cli.UsageError{Msg: fmt.Sprintf("unknown events command %q; %s", sub, usage)}
	}
	_, pool, err := c.Open(ctx, "relay", stderr)
	if err != nil {
		return err
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
	return cli.PrintList(stdout, list, asJSON, "no parked events", func(p outbox.ParkedEvent) string {
		return fmt.Sprintf("%s  %s.%s  note %s  created %s  parked %s  attempts %d  reason: %s", p.ID,
			p.Tenant, p.Type, p.NoteID, p.CreatedAt.UTC().Format(time.RFC3339), p.ParkedAt.UTC().Format(time.RFC3339), p.Attempts, p.Reason)
	})
}
