// Package worker is Quill's attachment worker (SPEC §7): it consumes
// note.created events from a durable JetStream pull consumer and, for each,
// processes the note's attachment (internal/attachment) outside any
// transaction, under a decode memory budget, then in one PostgreSQL
// transaction records the event id in the inbox, re-checks the attachment
// under its note's lock, stores the result and writes an
// attachment.processed event to the outbox. The message is acknowledged
// only after that transaction committed, so a crash at any point leads to a
// redelivery, and the inbox makes a redelivered event a counted duplicate
// with no second effect.
//
// Consumption is the public consumer package's (consumer.NewStaged): one
// pull consumer feeding a bounded pool, group commits, in-process retries,
// Nak backoff, the delivery-count check, dead letters and the shutdown.
// The worker brings its stages (pipeline.go): Prepare reads the batch's
// attachments and processes them outside any transaction under the decode
// budget, putting off the slow ones; Apply locks, re-checks and writes,
// each event's failure its own; Committed counts, notifies the relays and
// observes the latency. Its inbox rows and dead letters are the consumer
// package's, under its durable name, where operators and audits read them.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/tracing"
)

// The worker's choices among the consumer package's settings, for its
// workload: group commits of attachments processed outside the
// transaction. Every other setting of consumer.Config keeps the package's
// default.
const (
	// DefaultConsumer is the durable consumer's name (QUILL_CONSUMER),
	// also the name of its inbox rows and dead letters.
	DefaultConsumer = "attachment-worker"
	// DefaultConcurrency is the messages handled at once
	// (QUILL_WORKER_CONCURRENCY): 128 fill the batches (decision 0018);
	// SPEC §2 says 4.
	DefaultConcurrency = 128
	// BatchSize is the most events committed in one transaction
	// (consumer.Config.MaxBatch); a batch never holds more than
	// Concurrency.
	BatchSize = 64
	// BatchBytes closes a batch once its attachments' declared sizes reach
	// it (MaxBatchWeight): the batch's data is in memory until its commit.
	BatchBytes = 8 << 20
	// Committers is the group-commit transactions in flight at once, each
	// on its own connection (MaxConcurrentBatches): a batch ready while
	// that many commit waits, and grows meanwhile.
	Committers = 2
	// BatchWait is how long a batch waits for more events after its first
	// (MaxBatchWait): a nanosecond takes those waiting when a committer
	// becomes free, so batches grow with the load and a lone event is not
	// delayed (the consumer's zero would be its default).
	BatchWait = time.Nanosecond
	// DefaultDecodeMemory is the decode budget (SPEC §2): 256 MiB.
	DefaultDecodeMemory = 268435456
)

// Config tunes a worker. Every zero field takes its default.
type Config struct {
	// Consumer is the consumption's configuration — the consumer
	// package's, with its defaults: Durable is QUILL_CONSUMER, MaxDeliver
	// QUILL_MAX_DELIVER, AckWait QUILL_ACK_WAIT, Concurrency
	// QUILL_WORKER_CONCURRENCY. WithDefaults sets the worker's choices
	// above where zero; New sets Stream and FilterSubjects from Stream,
	// the batch weight, the validation, the logger and the clock.
	Consumer consumer.Config
	// Stream is the stream consumed; its zero fields take stream's
	// defaults.
	Stream stream.Config
	// DecodeMemory is the budget, in bytes, of the images decoded at once
	// (QUILL_WORKER_DECODE_MEMORY): each is admitted by its weight read
	// from its header (attachment.DecodeMemory) and waits until the
	// images being decoded leave room for it; one heavier than the whole
	// budget fails as too large. Default 256 MiB.
	DecodeMemory int64
	// Limits bound the processing of one attachment; its MaxPixels is
	// QUILL_MAX_PIXELS. Its DecodeMemory is ignored: the worker sets it to
	// the budget above.
	Limits attachment.Limits
}

// WithDefaults returns c with zero fields set to their defaults: the
// worker's choices, then the consumer package's.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	cc := &c.Consumer
	cc.Durable = cmp.Or(cc.Durable, DefaultConsumer)
	cc.Stream = c.Stream.Name
	cc.FilterSubjects = []string{c.FilterSubject()}
	cc.Concurrency = cmp.Or(cc.Concurrency, DefaultConcurrency)
	cc.MaxBatch = cmp.Or(cc.MaxBatch, BatchSize)
	cc.MaxBatchWeight = cmp.Or(cc.MaxBatchWeight, BatchBytes)
	cc.MaxConcurrentBatches = cmp.Or(cc.MaxConcurrentBatches, Committers)
	cc.MaxBatchWait = cmp.Or(cc.MaxBatchWait, BatchWait)
	cc.Weight = declaredSize
	c.Consumer = cc.WithDefaults()
	c.DecodeMemory = cmp.Or(c.DecodeMemory, DefaultDecodeMemory)
	c.Limits.MaxPixels = cmp.Or(c.Limits.MaxPixels, attachment.DefaultMaxPixels)
	return c
}

// Validate reports a setting that cannot work, naming its variable; the
// consumer package checks the rest of Consumer when New makes it.
func (c Config) Validate() error {
	cc := c.Consumer
	switch {
	case cc.AckWait < time.Second:
		return fmt.Errorf("QUILL_ACK_WAIT %s must be at least 1s", cc.AckWait)
	case cc.Concurrency > cc.MaxAckPending:
		return fmt.Errorf("QUILL_WORKER_CONCURRENCY %d exceeds the consumer's MaxAckPending %d", cc.Concurrency, cc.MaxAckPending)
	case strings.ContainsAny(cc.Durable, ". *>"):
		return fmt.Errorf("QUILL_CONSUMER %q must not contain '.', ' ', '*' or '>'", cc.Durable)
	case c.DecodeMemory < 1:
		return errors.New("QUILL_WORKER_DECODE_MEMORY must be at least 1")
	case c.Limits.MaxPixels < 1:
		return errors.New("QUILL_MAX_PIXELS must be at least 1")
	}
	return nil
}

// FilterSubject is the consumer's subject filter: every tenant's
// note.created events.
func (c Config) FilterSubject() string {
	return contract.TypeSubjects(c.Stream.SubjectPrefix, contract.EventNoteCreated)
}

// ConsumerConfig is the durable consumer the worker creates or updates
// (consumer.Config.ConsumerConfig): MaxDeliver unlimited on the server and
// no server BackOff — the worker counts deliveries itself and writes the
// dead letter, and spaces redeliveries with its Nak delay (decision 0019).
func (c Config) ConsumerConfig() jetstream.ConsumerConfig {
	cc := c.WithDefaults().Consumer.ConsumerConfig()
	cc.Description = "Quill attachment worker: note.created → attachment processing"
	return cc
}

// Hooks let tests act at points a crash could hit. Nil hooks cost nothing.
type Hooks struct {
	// BeforeProcess runs at the start of each delivery's handling; an
	// error fails it like a transient failure.
	BeforeProcess func(eventID string, delivery int) error
	// Processing runs when an event's attachment was admitted (decode
	// budget, CPU slot) and is about to be processed, outside any
	// transaction; a slow hook is a slow attachment.
	Processing func(eventID string)
	// AfterCommit runs after the transaction committed and before the
	// handler returns; an error stands for a crash before the
	// acknowledgement.
	AfterCommit func(eventID string) error
}

// Worker consumes note.created events and processes their attachments.
type Worker struct {
	pool     *pgxpool.Pool
	nc       *nats.Conn
	cfg      Config
	log      zerolog.Logger
	m        *metrics.Worker
	notifier *outbox.Notifier
	hooks    Hooks
	now      func() time.Time
	c        *consumer.Consumer
	store    *consumer.Store
	// tracer starts each event's handling span; nil: tracing is off.
	tracer trace.Tracer

	// cpu bounds the attachments processed at once.
	cpu chan struct{}
	// mem admits attachments by their decode weight under the budget;
	// memInUse is the weight admitted now (quill_worker_decode_memory_bytes).
	mem      *semaphore.Weighted
	memInUse prometheus.Gauge
	// consumerMetrics receives the consumer package's quill_consumer_*
	// metrics; nil: none.
	consumerMetrics prometheus.Registerer

	// kept holds, by event id, the processing of the events whose effect
	// has not committed yet: a later attempt — put off by its batch, the
	// fallback alone, a retry — takes it rather than processing again.
	mu   sync.Mutex
	kept map[string]*processing
	// processes are the processing goroutines, which Run waits for.
	processes sync.WaitGroup

	// batches and jobs count the batches prepared and the events they
	// carried (events handled alone not counted); largest is the most
	// events one batch carried.
	batches, jobs, largest atomic.Int64
}

// Option configures a Worker.
type Option func(*Worker)

// WithHooks installs test hooks.
func WithHooks(h Hooks) Option { return func(w *Worker) { w.hooks = h } }

// WithTracer makes a consumer span of each event's handling, the child of
// its publish (the message's traceparent), and the parent of the
// attachment.processed event it writes. Without it (tracing off) the
// message's trace context is passed on as it came.
func WithTracer(t trace.Tracer) Option { return func(w *Worker) { w.tracer = t } }

// WithNotifier signals n after each commit that wrote an outbox event, so
// relays publish it at once. Without it relays find it by polling.
func WithNotifier(n *outbox.Notifier) Option { return func(w *Worker) { w.notifier = n } }

// WithDecodeMemoryGauge sets g to the decode weight admitted at each
// moment (metrics.NewDecodeMemory). Without it the weight is not exported.
func WithDecodeMemoryGauge(g prometheus.Gauge) Option { return func(w *Worker) { w.memInUse = g } }

// WithConsumerMetrics registers the consumer package's metrics on reg,
// labelled with the consumer's name: above all
// quill_consumer_pending_messages, the backlog JetStream holds for it, and
// quill_consumer_acks_total, which together show a worker fleet that
// stopped consuming (SPEC §8). New returns an error when they are on reg
// already. Without it they are not exported.
func WithConsumerMetrics(reg prometheus.Registerer) Option {
	return func(w *Worker) { w.consumerMetrics = reg }
}

// New returns a worker over pool and nc. It returns an error when the
// configuration does not validate.
func New(pool *pgxpool.Pool, nc *nats.Conn, cfg Config, log zerolog.Logger, m *metrics.Worker, opts ...Option) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	w := &Worker{pool: pool, nc: nc, cfg: cfg, log: log, m: m, now: time.Now,
		cpu: make(chan struct{}, runtime.GOMAXPROCS(0)), mem: semaphore.NewWeighted(cfg.DecodeMemory),
		kept: map[string]*processing{}}
	for _, o := range opts {
		o(w)
	}
	if w.memInUse == nil {
		// Counted all the same, on a gauge no registry exports.
		w.memInUse = prometheus.NewGauge(prometheus.GaugeOpts{Name: "quill_worker_decode_memory_bytes"})
	}
	store, err := consumer.NewStore(pool, cfg.Consumer.TablePrefix)
	if err != nil {
		return nil, err
	}
	w.store = store
	ccfg := cfg.Consumer
	ccfg.Logger = slog.New(zerolog.NewSlogHandler(log))
	ccfg.Now = w.now
	ccfg.Validate = w.validate
	ccfg.Registerer = w.consumerMetrics
	ccfg.DeadLetters = deadLetterWriter{w}
	w.c, err = consumer.NewStaged(pool, js, ccfg, consumer.Stages{Prepare: w.prepare, Apply: w.apply, Committed: w.committed})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	return w, nil
}

// Config returns the worker's configuration with defaults applied.
func (w *Worker) Config() Config { return w.cfg }

// Provision creates or updates the durable consumer on the stream. The
// stream is the relay's to create (package stream): a missing one is an
// error wrapping jetstream.ErrStreamNotFound that says the worker waits for
// a relay; other errors wrap NATS's. Run provisions on its own, retrying
// until it succeeds.
func (w *Worker) Provision(ctx context.Context) error {
	_, err := w.c.Provision(ctx)
	return w.explain(err)
}

// explain words the consumer's error about a missing stream as the
// worker's operators read it.
func (w *Worker) explain(err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("stream %s not found; waiting for a relay to create it: %w", w.cfg.Stream.Name, jetstream.ErrStreamNotFound)
	}
	return err
}

// Ready reports why the worker cannot consume (the stream missing, the
// consumer not readable), else whether NATS is connected and PostgreSQL
// answers (see metrics.CheckConnected).
func (w *Worker) Ready(ctx context.Context) error {
	err := w.c.Ready(ctx)
	switch {
	case err == nil:
		return metrics.CheckConnected(ctx, w.nc, w.pool)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return w.explain(err)
	}
	// The consumer's fetch fails: say which dependency, when it is one.
	if cerr := metrics.CheckConnected(ctx, w.nc, w.pool); cerr != nil {
		return cerr
	}
	return fmt.Errorf("NATS: consume %s: %w", w.cfg.Consumer.Durable, err)
}

// DeadLetterCount returns the consumer's dead letters not yet retried, as
// its poll last counted them in the database (quill_worker_dead_letters
// reads it); 0 without WithConsumerMetrics, which the poll needs.
func (w *Worker) DeadLetterCount() int64 { return w.c.DeadLetterCount() }

// Run consumes until ctx ends, then stops fetching, lets the messages in
// flight finish (and be acknowledged) for up to the consumer's
// ShutdownTimeout, and returns nil.
// Until the stream exists and the durable consumer can be created (NATS
// down, no relay has created the stream yet) it retries with backoff, and
// Ready says why; it never returns for that. It returns an error when the
// consumer cannot start or stops on its own.
func (w *Worker) Run(ctx context.Context) error {
	cc := w.cfg.Consumer
	w.log.Info().Str("consumer", cc.Durable).Str("filter", w.cfg.FilterSubject()).Int("concurrency", cc.Concurrency).
		Int("batch_size", cc.MaxBatch).Int("committers", cc.MaxConcurrentBatches).Msg("starting")
	err := w.c.Run(ctx)
	// A processing whose event the shutdown gave up on still holds its
	// share of the decode budget and a CPU slot; it ends on its own.
	w.processes.Wait()
	return err
}

// validate refuses, before any transaction, what is not a note.created
// event the worker can process (the consumer has checked its CloudEvents
// form and that its tenant is its subject's).
func (w *Worker) validate(ev consumer.Event) error {
	_, err := parse(ev)
	return err
}

// declaredSize is an event's weight in a batch: its attachment's declared
// size, the bytes the batch keeps in memory until its commit.
func declaredSize(ev consumer.Event) int64 {
	p, err := parse(ev)
	if err != nil || p.att == nil {
		return 0
	}
	return int64(p.att.size)
}

// deadLetterWriter writes the worker's dead letters to the consumer
// package's table, worded as its operators read them (docs/worker.md),
// counted and logged.
type deadLetterWriter struct{ w *Worker }

var _ consumer.DeadLetterWriter = deadLetterWriter{}

func (d deadLetterWriter) WriteDeadLetter(ctx context.Context, l consumer.DeadLetter) error {
	w, dv := d.w, l.Event.Delivery
	if l.Event.ID == "" {
		// Not an event: the publisher's message id names it.
		l.Event.ID = dv.Header.Get(nats.MsgIdHdr)
	}
	var past *consumer.TooManyDeliveriesError
	if errors.As(l.Err, &past) {
		l.Reason = fmt.Sprintf("delivered %d times, the limit is %d (not processed again)", past.Deliveries, past.Limit)
	}
	if err := w.store.WriteDeadLetter(ctx, w.cfg.Consumer.Durable, l, w.now()); err != nil {
		return err
	}
	w.m.Message(metrics.WorkerDeadLettered)
	w.log.Warn().Ctx(tracing.Extract(ctx, dv.Header.Get("traceparent"), dv.Header.Get("tracestate"))).
		Str("event_id", l.Event.ID).Int("deliveries", dv.Deliveries).Str("error_category", "dead_letter").
		Str("reason", l.Reason).Msg("giving up on the message: dead letter recorded")
	return nil
}
