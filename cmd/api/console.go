package main

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/console"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/retention"
)

// consoleSettings are api serve's settings for the operator console: the
// horizons its lookups apply and the NATS it checks the stream with and
// retries dead letters through — the settings "api audit" takes.
type consoleSettings struct {
	enabled bool
	nats    natsconn.Settings
	audit   audit.Config
}

func (c *consoleSettings) define(s *config.Set) {
	s.Bool(&c.enabled, "console", "QUILL_CONSOLE", true, "serve the operator console at /console/ on the admin address (true or false)")
	c.nats.Define(s, "NATS with JetStream, for the operator console only (stream checks, dead-letter retries); the API serves without it")
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
		return nil, nil, c.nats.Explain(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	cfg.Stream, cfg.Consumer = c.audit.Stream, c.audit.Consumer
	cfg.OutboxRetention, cfg.InboxRetention = c.audit.OutboxRetention, c.audit.InboxRetention
	con, err := console.New(console.Deps{Pool: pool, Log: log, Config: console.Config{Audit: cfg},
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
