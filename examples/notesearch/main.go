// Command notesearch is an example consumer of Quill's events: it keeps a
// per-tenant search table of notes in its own PostgreSQL database, applying
// note.created, note.updated and note.deleted through package consumer, so
// that each event takes effect once although JetStream delivers it at least
// once, and a note's events in version order (consumer.VersionsInOrder).
// See README.md.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/examples/notesearch/projection"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "notesearch:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// Defaults of the settings.
const (
	defaultDatabaseURL     = "postgres://postgres@127.0.0.1:5432/notesearch?sslmode=disable"
	defaultNATSURL         = nats.DefaultURL
	defaultDurable         = "notesearch"
	defaultOrderByNote     = true
	defaultInboxRetention  = 336 * time.Hour // twice the stream's default MaxAge
	defaultCleanupInterval = time.Hour
	cleanupBatch           = 1000
)

// usageError is a setting that cannot work: exit 2, before anything
// connects.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// settings are notesearch's configuration: flags over environment over
// defaults.
type settings struct {
	databaseURL     string
	natsURL         string
	stream          string
	prefix          string
	durable         string
	concurrency     int
	orderByNote     bool
	ackWait         time.Duration
	shutdownTimeout time.Duration
	inboxRetention  time.Duration
	cleanupInterval time.Duration
}

// parse reads args over getenv. Its errors are usageErrors; -h gives
// flag.ErrHelp.
func parse(args []string, getenv func(string) string, stderr io.Writer) (settings, error) {
	env := func(k, def string) string { return cmp.Or(getenv(k), def) }
	var s settings
	fs := flag.NewFlagSet("notesearch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.databaseURL, "database-url", env("DATABASE_URL", defaultDatabaseURL), "notesearch's own PostgreSQL database (DATABASE_URL)")
	fs.StringVar(&s.natsURL, "nats-url", env("NATS_URL", defaultNATSURL), "NATS with Quill's stream (NATS_URL)")
	fs.StringVar(&s.stream, "stream", env("QUILL_STREAM", contract.DefaultStream), "Quill's JetStream stream (QUILL_STREAM)")
	fs.StringVar(&s.prefix, "subject-prefix", env("QUILL_SUBJECT_PREFIX", contract.DefaultSubjectPrefix), "first token of Quill's subjects (QUILL_SUBJECT_PREFIX)")
	fs.StringVar(&s.durable, "durable", env("NOTESEARCH_DURABLE", defaultDurable), "durable JetStream consumer, also the inbox's key (NOTESEARCH_DURABLE)")
	concurrency := fs.String("concurrency", env("NOTESEARCH_CONCURRENCY", strconv.Itoa(consumer.DefaultConcurrency)), "events handled at once (NOTESEARCH_CONCURRENCY)")
	orderByNote := fs.String("order-by-note", env("NOTESEARCH_ORDER_BY_NOTE", strconv.FormatBool(defaultOrderByNote)), "handle one note's events one at a time (NOTESEARCH_ORDER_BY_NOTE)")
	ackWait := fs.String("ack-wait", env("NOTESEARCH_ACK_WAIT", consumer.DefaultAckWait.String()), "the durable consumer's ack wait, at least 1s (NOTESEARCH_ACK_WAIT)")
	shutdown := fs.String("shutdown-timeout", env("NOTESEARCH_SHUTDOWN_TIMEOUT", consumer.DefaultShutdownTimeout.String()), "how long running handlers may finish at shutdown (NOTESEARCH_SHUTDOWN_TIMEOUT)")
	retention := fs.String("inbox-retention", env("NOTESEARCH_INBOX_RETENTION", defaultInboxRetention.String()), "how long an applied event id is remembered, at least the stream's MaxAge (NOTESEARCH_INBOX_RETENTION)")
	cleanup := fs.String("cleanup-interval", env("NOTESEARCH_CLEANUP_INTERVAL", defaultCleanupInterval.String()), "how often expired inbox rows are deleted (NOTESEARCH_CLEANUP_INTERVAL)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return s, err
		}
		return s, usageError{err}
	}
	if fs.NArg() > 0 {
		return s, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	var err error
	if s.concurrency, err = strconv.Atoi(*concurrency); err != nil || s.concurrency < 1 {
		return s, usageError{fmt.Errorf("concurrency %q: want a positive integer", *concurrency)}
	}
	if s.orderByNote, err = strconv.ParseBool(*orderByNote); err != nil {
		return s, usageError{fmt.Errorf("order-by-note %q: want true or false", *orderByNote)}
	}
	for _, d := range []struct {
		name string
		in   string
		out  *time.Duration
		min  time.Duration
	}{
		{"ack-wait", *ackWait, &s.ackWait, time.Second},
		{"shutdown-timeout", *shutdown, &s.shutdownTimeout, time.Millisecond},
		{"inbox-retention", *retention, &s.inboxRetention, time.Hour},
		{"cleanup-interval", *cleanup, &s.cleanupInterval, time.Second},
	} {
		v, err := time.ParseDuration(d.in)
		if err != nil || v < d.min {
			return s, usageError{fmt.Errorf("%s %q: want a duration of at least %s", d.name, d.in, d.min)}
		}
		*d.out = v
	}
	if s.prefix == "" || strings.ContainsAny(s.prefix, ".*> \t\r\n") {
		return s, usageError{fmt.Errorf("subject-prefix %q: want one subject token", s.prefix)}
	}
	if _, err := pgxpool.ParseConfig(s.databaseURL); err != nil {
		// pgx's error may quote the URL, password included.
		return s, usageError{errors.New("database-url: not a PostgreSQL connection string")}
	}
	return s, nil
}

// run is notesearch: it parses its settings, prepares its tables, and
// applies Quill's note events to them until ctx ends. It returns a
// usageError for a bad setting, an error when PostgreSQL or NATS cannot be
// reached at start, and nil after a graceful shutdown.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	s, err := parse(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))

	pcfg, _ := pgxpool.ParseConfig(s.databaseURL) // checked by parse
	// Each running handler holds a connection for its transaction; one more
	// is for the cleanup.
	pcfg.MaxConns = max(pcfg.MaxConns, int32(s.concurrency)+1)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("PostgreSQL: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w", pcfg.ConnConfig.Host, err)
	}
	if err := consumer.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := projection.Migrate(ctx, pool); err != nil {
		return err
	}

	nc, err := nats.Connect(s.natsURL, nats.Name("notesearch"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("NATS at %s: %w", s.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}

	validate, err := consumer.SchemaValidator()
	if err != nil {
		return fmt.Errorf("event schemas: %w", err)
	}
	c, err := consumer.New(pool, js, consumer.Config{
		Validate: validate,
		Durable:  s.durable,
		Stream:   s.stream,
		// Every note event, so the in-order guard: a note's versions are
		// contiguous, and an update applied before the one it follows
		// would lose that one's fields.
		FilterSubjects: []string{
			contract.TypeSubjects(s.prefix, contract.EventNoteCreated),
			contract.TypeSubjects(s.prefix, contract.EventNoteUpdated),
			contract.TypeSubjects(s.prefix, contract.EventNoteDeleted),
		},
		Versions:        consumer.VersionsInOrder,
		Concurrency:     s.concurrency,
		OrderBySubject:  s.orderByNote,
		AckWait:         s.ackWait,
		ShutdownTimeout: s.shutdownTimeout,
		Logger:          log,
		Registerer:      prometheus.NewRegistry(),
	}, projection.Apply)
	if err != nil {
		return usageError{err}
	}
	log.Info("notesearch started", "stream", s.stream, "durable", s.durable, "concurrency", s.concurrency, "order_by_note", s.orderByNote)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.Run(gctx) })
	g.Go(func() error { return cleanInbox(gctx, c, s, log) })
	if err := g.Wait(); err != nil {
		return err
	}
	log.Info("notesearch stopped")
	return nil
}

// cleanInbox deletes the inbox rows older than the retention every
// cleanup interval, and the version guard's rows of notes deleted longer
// ago than it, until ctx ends. A failure is logged and tried again next
// time: a late cleanup costs only disk.
func cleanInbox(ctx context.Context, c *consumer.Consumer, s settings, log *slog.Logger) error {
	t := time.NewTicker(s.cleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cutoff := time.Now().Add(-s.inboxRetention)
		for _, step := range []struct {
			name   string
			delete func(context.Context, time.Time, int) (int64, error)
		}{{"inbox", c.DeleteInboxBefore}, {"versions", c.DeleteVersionsBefore}} {
			for {
				n, err := step.delete(ctx, cutoff, cleanupBatch)
				if err != nil {
					if ctx.Err() == nil {
						log.Warn(step.name+" cleanup failed; retrying next interval", "error", err)
					}
					break
				}
				if n < cleanupBatch {
					break
				}
			}
		}
	}
}
