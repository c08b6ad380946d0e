package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/worker"
)

const overview = `usage: attachment-worker [run] [flags]                                   process note.created events (default)
       attachment-worker dead-letters list [--consumer NAME] [--all] [--json]  list a consumer's dead letters
       attachment-worker dead-letters retry [--consumer NAME] ID               re-drive a dead letter to its subject
       attachment-worker probe [--live]                                        exit 0 when the running worker is ready (alive): a health check

Run "attachment-worker run --help" for the settings.`

// defaultAdminAddr is the worker's admin address (SPEC §2).
const defaultAdminAddr = ":9092"

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runWith(ctx, args, getenv, stdout, stderr, nil)
}

// runWith is run with options for the worker (the tests' hooks) and, when
// tune is not nil, a change of its configuration after the settings (a
// test's batch wait).
func runWith(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, tune func(*worker.Config), opts ...worker.Option) error {
	c := settings{opts: opts, tune: tune}
	return daemon.Program{
		Name:      "attachment-worker",
		Overview:  overview,
		About:     "Consumes note.created events and processes their attachments, once per event.",
		AdminAddr: defaultAdminAddr,
		Define:    c.define,
		Start:     c.start,
		Commands:  map[string]cli.RunFunc{"dead-letters": deadLetters},
	}.Main(ctx, args, getenv, stdout, stderr)
}

// settings are the worker's own settings, besides daemon.Settings.
type settings struct {
	worker worker.Config
	// decodeMemory and maxPixels are worker.Config's DecodeMemory and
	// Limits.MaxPixels, parsed as ints.
	decodeMemory, maxPixels int
	// opts are the worker's options beyond the settings (tests' hooks).
	opts []worker.Option
	tune func(*worker.Config)
}

func (c *settings) define(s *config.Set) {
	w := &c.worker
	w.Stream.DefineSubjects(s)
	defineConsumer(s, &w.Consumer.Durable)
	s.Int(&w.Consumer.MaxDeliver, "max-deliver", "QUILL_MAX_DELIVER", consumer.DefaultMaxDeliver, 1, "deliveries before a failing event becomes a dead letter")
	s.Duration(&w.Consumer.AckWait, "ack-wait", "QUILL_ACK_WAIT", consumer.DefaultAckWait, "the consumer's ack wait")
	s.Int(&w.Consumer.Concurrency, "concurrency", "QUILL_WORKER_CONCURRENCY", worker.DefaultConcurrency, 1, "events handled at once (each waits for its transaction's commit)")
	s.Int(&c.decodeMemory, "decode-memory", "QUILL_WORKER_DECODE_MEMORY", worker.DefaultDecodeMemory, 1,
		"bytes the images decoded at once may take together (width × height × bytes per pixel, from the header); an image that needs more fails as too large")
	s.Int(&c.maxPixels, "max-pixels", "QUILL_MAX_PIXELS", attachment.DefaultMaxPixels, 1, "largest image (width × height) decoded; a larger one fails as too large")
}

func (c *settings) start(ctx context.Context, ds daemon.Settings, stderr io.Writer) error {
	c.worker.DecodeMemory, c.worker.Limits.MaxPixels = int64(c.decodeMemory), int64(c.maxPixels)
	if c.tune != nil {
		c.tune(&c.worker)
	}
	cfg := c.worker.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	// A connection per committer (a batch's transaction), and some for
	// the reads before processing, the events handled alone (a
	// redelivery, a retry), dead letters, the notifier and the readiness
	// check; beyond them an event waits for a connection.
	d, err := daemon.Start(ctx, ds, daemon.Process{Name: "attachment-worker", Service: "quill-worker", PoolSize: int32(cfg.Consumer.MaxConcurrentBatches + 4),
		Disconnected: "NATS connection lost; reconnecting"}, stderr)
	if err != nil {
		return err
	}
	defer d.Close()
	log := d.Log
	notifier := outbox.NewNotifier(d.Pool, func(err error) { log.Warn().Err(err).Msg("notify relays") })
	w, err := worker.New(d.Pool, d.NATS, cfg, log, metrics.NewWorker(d.Registry),
		append(c.opts, worker.WithNotifier(notifier), worker.WithDecodeMemoryGauge(metrics.NewDecodeMemory(d.Registry)),
			worker.WithConsumerMetrics(d.Registry), worker.WithTracer(d.Tracer()))...)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	metrics.RegisterWorkerDeadLetters(d.Registry, w.DeadLetterCount)
	// The notifier outlives the worker, so the last commits still wake
	// the relays.
	return d.Run(ctx, daemon.Services{Ready: map[string]metrics.ReadyFunc{"worker": w.Ready},
		Loops: []func(context.Context) error{w.Run}, Trailing: []func(context.Context) error{notifier.Run}})
}

// defineConsumer defines the durable consumer's name: the worker's, and
// the one whose dead letters the dead-letters commands read.
func defineConsumer(s *config.Set, name *string) {
	s.String(name, "consumer", "QUILL_CONSUMER", worker.DefaultConsumer,
		"durable consumer name, also the name its inbox rows and dead letters are kept under")
}

func deadLetters(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: attachment-worker dead-letters list [--consumer NAME] [--all] [--json] | attachment-worker dead-letters retry [--consumer NAME] ID"
	sub, args, ok, err := cli.Subcommand("attachment-worker", args, usage, stdout)
	if !ok {
		return err
	}
	switch sub {
	case "list", "retry":
	default:
		return cli.UsageError{Msg: fmt.Sprintf("unknown dead-letters command %q; %s", sub, usage)}
	}
	var c daemon.CommandSettings
	var natsCfg natsconn.Settings
	var name string
	var all, asJSON bool
	s := config.New("attachment-worker dead-letters "+sub, usage, getenv, stdout)
	c.Define(s)
	// Any consumer built on the consumer package keeps its dead letters
	// in the same table, under its own name: these commands serve each.
	defineConsumer(s, &name)
	if sub == "list" {
		s.FlagSet().BoolVar(&all, "all", false, "include dead letters already re-driven")
		s.FlagSet().BoolVar(&asJSON, "json", false, "one JSON object per line")
	} else {
		natsCfg.Define(s, "NATS with JetStream")
	}
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	if err := natsCfg.Validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	var id int64
	switch {
	case sub == "list" && len(s.Args()) > 0, sub == "retry" && len(s.Args()) != 1:
		return cli.UsageError{Msg: usage}
	case sub == "retry":
		if id, err = strconv.ParseInt(s.Args()[0], 10, 64); err != nil || id < 1 {
			return cli.UsageError{Msg: fmt.Sprintf("%q is not a dead letter id (a positive integer)", s.Args()[0])}
		}
	}
	log, pool, err := c.Open(ctx, "attachment-worker", stderr)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := consumer.NewStore(pool, "")
	if err != nil {
		return err
	}
	if sub == "retry" {
		l, err := store.DeadLetter(ctx, name, id)
		if errors.Is(err, consumer.ErrDeadLetterNotFound) {
			return cli.UsageError{Msg: err.Error()}
		}
		if err != nil {
			return err
		}
		nc, err := natsCfg.Connect(nats.Name("quill-attachment-worker-cli"))
		if err != nil {
			log.Error().Err(err).Str("error_category", "nats_unreachable").Msg("NATS is not reachable at NATS_URL")
			return cli.LoggedError{Err: err}
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ack, err := store.Redrive(rctx, js, l, time.Now())
		if err != nil {
			return err
		}
		dup := ""
		if ack.Duplicate {
			dup = " (already re-driven within the duplicate window: not published again)"
		}
		fmt.Fprintf(stdout, "dead letter %d (event %s) republished to %s as stream sequence %d%s\n", l.ID, cli.Printable(l.EventID), cli.Printable(l.Subject), ack.Sequence, dup)
		return nil
	}
	list, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: name, All: all})
	if err != nil {
		return err
	}
	return cli.PrintList(stdout, list, asJSON, "no dead letters", func(l consumer.StoredDeadLetter) string {
		retried := ""
		if l.RetriedAt != nil {
			retried = "  retried " + l.RetriedAt.UTC().Format(time.RFC3339)
		}
		// Every field that came from the message or its processing is
		// escaped: a hostile event must not write control characters or
		// terminal escape sequences to an operator's terminal.
		return fmt.Sprintf("%d  event %s  %s  stream seq %d  deliveries %d  created %s%s  error: %s", l.ID, cli.Printable(l.EventID),
			cli.Printable(l.Subject), l.StreamSeq, l.Deliveries, l.CreatedAt.UTC().Format(time.RFC3339), retried, cli.Printable(l.Reason))
	})
}
