package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/console"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/retention"
)

// consoleSettings are api serve's settings for the operator console: the
// horizons its lookups apply — the settings "api audit" takes — and the
// NATS it checks the stream with and retries dead letters through.
type consoleSettings struct {
	enabled bool
	audit   audit.Config
	// nats and proxies are the daemon's NATS_URL … and
	// QUILL_TRUSTED_PROXIES (read with the HTTP settings, which the
	// connection share exempts too), set before newConsole.
	nats    natsconn.Settings
	proxies console.TrustedProxies
}

// defaultConsole is off: a default install serves no sign-in page on its
// admin address (make dev and compose turn it on).
const defaultConsole = false

func (c *consoleSettings) define(s *config.Set) {
	s.Bool(&c.enabled, "console", "QUILL_CONSOLE", defaultConsole, "serve the operator console at /console/ on the admin address (true or false)")
	c.audit.Stream.DefineSubjects(s)
	s.String(&c.audit.Consumer, "consumer", "QUILL_CONSUMER", audit.DefaultConsumer, "the attachment worker's durable consumer (its inbox and dead letters), for the console")
	s.Duration(&c.audit.OutboxRetention, "outbox-retention", "QUILL_OUTBOX_RETENTION", retention.DefaultOutboxRetention, "how long published events stay in the outbox (the console's lookups judge by it)")
	s.Duration(&c.audit.InboxRetention, "inbox-retention", "QUILL_INBOX_RETENTION", retention.DefaultInboxRetention, "how long the worker remembers processed event ids (the console's lookups judge by it)")
}

// newConsole returns the console and a function that closes its NATS
// connection, or a nil console when it is disabled. The NATS connection is
// made in the background and kept: while NATS is away the console's
// lookups leave the stream unchecked and its dead letters wait. cfg holds
// the API's own retentions.
func newConsole(c *consoleSettings, pool *pgxpool.Pool, log zerolog.Logger, cfg audit.Config) (*console.Console, func(), error) {
	if !c.enabled {
		return nil, func() {}, nil
	}
	nc, err := c.nats.Connect(nats.Name("quill-api-console"), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, err // explained and scrubbed by Connect
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	cfg.Stream, cfg.Consumer = c.audit.Stream, c.audit.Consumer
	cfg.OutboxRetention, cfg.InboxRetention = c.audit.OutboxRetention, c.audit.InboxRetention
	con, err := console.New(console.Deps{Pool: pool, Log: log, Config: console.Config{Audit: cfg, TrustedProxies: c.proxies},
		JetStream: func() jetstream.JetStream {
			if !nc.IsConnected() {
				return nil
			}
			return js
		}})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return con, nc.Close, nil
}

// consoleCmd is "api console rotate-key [--end-sessions]": a new session
// key for the operator console.
func consoleCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: api console rotate-key [--end-sessions]"
	if len(args) == 0 || args[0] != "rotate-key" {
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			return cli.UsageError{Msg: fmt.Sprintf("unknown console command %q; %s", args[0], usage)}
		}
		return cli.UsageError{Msg: usage}
	}
	var c daemon.CommandSettings
	var end bool
	s := config.New("api console rotate-key", usage+"\n\nMakes a new session key for the operator console: new sessions are signed with it (on a running API within 30 s), the previous key still verifies its sessions until they expire (12 h), and keys that verify no session any more are dropped. --end-sessions drops every older key, ending every session within 30 s (after a key leaked).", getenv, stdout)
	c.Define(s)
	s.FlagSet().BoolVar(&end, "end-sessions", false, "drop every older key: every console session ends (within 30 s on a running API)")
	if err := cli.Parse(s, args[1:]); err != nil {
		return err
	}
	if len(s.Args()) > 0 {
		return cli.UsageError{Msg: fmt.Sprintf("unexpected arguments %q; %s", s.Args(), usage)}
	}
	log, pool, err := c.Open(ctx, "api", stderr)
	if err != nil {
		return err
	}
	defer pool.Close()
	rot, err := console.RotateSessionKey(ctx, pool, time.Now(), end)
	if err != nil {
		return err
	}
	log.Info().Int32("session_key", rot.ID).Int64("dropped_keys", rot.Dropped).Bool("end_sessions", end).Msg("console session key rotated")
	fmt.Fprintf(stdout, "console session key %d signs new sessions from now on; %d older key(s) dropped\n", rot.ID, rot.Dropped)
	return nil
}
