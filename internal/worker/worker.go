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
// Transactions are group commits: the router's handlers submit their events
// to a committer, which handles the events waiting at that moment (up to
// BatchSize) in one transaction, each event's failure its own (see
// commit.go); each handler returns only once its event's transaction
// committed, so every message is still acknowledged after its own effect.
//
// Consumption runs on a watermill router with the watermill-nats JetStream
// subscriber, which acknowledges (DoubleAck) after the handler returned nil
// and Naks, with a backoff delay, after an error. Middleware, outermost
// first: the progress reports (InProgress while the chain works), the
// poison queue (dead letters, see internal/deadletter), the delivery-count
// check (a message past MaxDeliver is a dead letter before it is processed,
// one failing on its last delivery after), in-process retries of transient
// errors, and panic recovery.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/deadletter"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/wait"
)

// Defaults of Config.
const (
	DefaultConsumer      = "attachment-worker"
	DefaultMaxDeliver    = 10
	DefaultAckWait       = 30 * time.Second
	DefaultConcurrency   = 128
	DefaultRetries       = 3
	DefaultRetryInterval = 100 * time.Millisecond
	DefaultNakDelay      = time.Second
	DefaultMaxNakDelay   = 30 * time.Second
	// DefaultMaxAckPending bounds the messages delivered and not yet
	// acknowledged across every worker process of the consumer.
	DefaultMaxAckPending = 256
	// DefaultPrefetch is the most messages one subscription pulls ahead
	// by default (fewer when Concurrency × DefaultPrefetch would exceed
	// MaxAckPending); DefaultConcurrency × DefaultPrefetch =
	// DefaultMaxAckPending.
	DefaultPrefetch = 2
	// DefaultBatchSize is the most events committed in one transaction.
	DefaultBatchSize = 64
	// DefaultBatchBytes bounds the attachment bytes of one transaction.
	DefaultBatchBytes = 8 << 20
	// DefaultCommitters is the number of transactions in flight at once.
	DefaultCommitters = 2
	// DefaultDecodeMemory is the decode budget (SPEC §2): 256 MiB.
	DefaultDecodeMemory = 268435456
)

// Config tunes a worker. Every zero field takes its default.
type Config struct {
	// Stream is the stream consumed; its zero fields take stream's
	// defaults. Its DuplicateWindow and MaxAge are used only to create the
	// stream when it does not exist yet (the relay owns its settings).
	Stream stream.Config
	// Consumer is the durable consumer's name, also the inbox's consumer
	// (QUILL_CONSUMER). Default attachment-worker.
	Consumer string
	// MaxDeliver is the number of deliveries after which a failing message
	// becomes a dead letter (QUILL_MAX_DELIVER). Default 10.
	MaxDeliver int
	// AckWait is the consumer's ack wait (QUILL_ACK_WAIT); a handler
	// reports progress every third of it. Default 30s.
	AckWait time.Duration
	// Concurrency is the number of messages handled at once
	// (QUILL_WORKER_CONCURRENCY): the router's subscriptions, each waiting
	// for its message's transaction to commit. It bounds the group commit:
	// a transaction carries at most min(Concurrency, BatchSize) events,
	// and a handler spends part of its time outside the committer
	// (delivery, acknowledgement), so the batches need about twice
	// BatchSize handlers to fill. Default 128.
	Concurrency int
	// BatchSize is the most events committed in one transaction
	// (QUILL_WORKER_BATCH_SIZE); 1 commits every event alone. Default 64.
	BatchSize int
	// BatchBytes stops a transaction from taking more events once their
	// attachments reach this many bytes (declared sizes): the batch's data
	// is in memory until its transaction commits
	// (QUILL_WORKER_BATCH_BYTES). Default 8 MiB.
	BatchBytes int
	// BatchWait is how long a transaction waits for more events after the
	// first (QUILL_WORKER_BATCH_WAIT). Default 0: it takes the events
	// waiting when a committer becomes free, so batches grow with the load
	// and a lone event is not delayed.
	BatchWait time.Duration
	// Committers is the number of group-commit transactions in flight at
	// once, each on its own connection (QUILL_WORKER_COMMITTERS).
	// Default 2.
	Committers int
	// MaxAckPending is the consumer's MaxAckPending. Default 256.
	MaxAckPending int
	// Prefetch is how many messages each of the Concurrency subscriptions
	// pulls ahead. Default DefaultPrefetch, or 1 when Concurrency ×
	// DefaultPrefetch exceeds MaxAckPending.
	Prefetch int
	// Retries is how often a transient failure is retried in process
	// before the message is Nak'ed. Default 3; negative means none.
	Retries int
	// RetryInterval is the first in-process retry's delay, doubled each
	// time. Default 100ms.
	RetryInterval time.Duration
	// NakDelay is the redelivery delay after the first failed delivery,
	// doubled per delivery up to MaxNakDelay. Defaults 1s and 30s.
	NakDelay, MaxNakDelay time.Duration
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

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	c.Consumer = cmp.Or(c.Consumer, DefaultConsumer)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, DefaultMaxDeliver)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.BatchBytes = cmp.Or(c.BatchBytes, DefaultBatchBytes)
	c.Committers = cmp.Or(c.Committers, DefaultCommitters)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, DefaultMaxAckPending)
	if c.Prefetch == 0 {
		// A higher concurrency pulls fewer messages ahead per
		// subscription, so that QUILL_WORKER_CONCURRENCY alone can go up
		// to MaxAckPending.
		c.Prefetch = max(1, min(DefaultPrefetch, c.MaxAckPending/c.Concurrency))
	}
	c.Retries = cmp.Or(c.Retries, DefaultRetries)
	c.RetryInterval = cmp.Or(c.RetryInterval, DefaultRetryInterval)
	c.NakDelay = cmp.Or(c.NakDelay, DefaultNakDelay)
	c.MaxNakDelay = cmp.Or(c.MaxNakDelay, DefaultMaxNakDelay)
	c.DecodeMemory = cmp.Or(c.DecodeMemory, DefaultDecodeMemory)
	c.Limits.MaxPixels = cmp.Or(c.Limits.MaxPixels, attachment.DefaultMaxPixels)
	return c
}

// Validate reports a setting that cannot work, naming it.
func (c Config) Validate() error {
	switch {
	case c.MaxDeliver < 1:
		return errors.New("QUILL_MAX_DELIVER must be at least 1")
	case c.AckWait < time.Second:
		return fmt.Errorf("QUILL_ACK_WAIT %s must be at least 1s", c.AckWait)
	case c.Concurrency < 1:
		return errors.New("QUILL_WORKER_CONCURRENCY must be at least 1")
	case c.BatchSize < 1:
		return errors.New("QUILL_WORKER_BATCH_SIZE must be at least 1")
	case c.BatchBytes < 1:
		return errors.New("QUILL_WORKER_BATCH_BYTES must be at least 1")
	case c.BatchWait < 0:
		return fmt.Errorf("QUILL_WORKER_BATCH_WAIT %s must not be negative", c.BatchWait)
	case c.BatchWait >= c.AckWait/2:
		return fmt.Errorf("QUILL_WORKER_BATCH_WAIT %s must be shorter than half of QUILL_ACK_WAIT %s", c.BatchWait, c.AckWait)
	case c.Committers < 1:
		return errors.New("QUILL_WORKER_COMMITTERS must be at least 1")
	case c.DecodeMemory < 1:
		return errors.New("QUILL_WORKER_DECODE_MEMORY must be at least 1")
	case c.Limits.MaxPixels < 1:
		return errors.New("QUILL_MAX_PIXELS must be at least 1")
	case c.Concurrency*c.Prefetch > c.MaxAckPending:
		return fmt.Errorf("QUILL_WORKER_CONCURRENCY %d × prefetch %d exceeds the consumer's MaxAckPending %d", c.Concurrency, c.Prefetch, c.MaxAckPending)
	case strings.ContainsAny(c.Consumer, ". *>"):
		return fmt.Errorf("QUILL_CONSUMER %q must not contain '.', ' ', '*' or '>'", c.Consumer)
	}
	return nil
}

// FilterSubject is the consumer's subject filter: every tenant's
// note.created events.
func (c Config) FilterSubject() string {
	return stream.OfType(c.Stream.SubjectPrefix, outbox.TypeNoteCreated)
}

// ConsumerConfig is the durable consumer the worker creates or updates.
//
// MaxDeliver is unlimited on the server: the worker counts deliveries itself
// and dead-letters a message on its MaxDeliver-th failed delivery. Were the
// server to stop at MaxDeliver, a message whose last delivery failed because
// PostgreSQL was down — when the dead letter cannot be written either — would
// never be delivered again and be lost from sight.
//
// No server-side BackOff: the redelivery delay after a failure is the
// worker's Nak delay (NakDelay doubling up to MaxNakDelay). With a BackOff
// set, nats-server reckons a delayed Nak against the BackOff step of the
// next delivery rather than the AckWait, so a later delivery would come an
// AckWait late.
func (c Config) ConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.Consumer,
		Description:   "Quill attachment worker: note.created → attachment processing",
		FilterSubject: c.FilterSubject(),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
	}
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
	js       jetstream.JetStream
	cfg      Config
	log      zerolog.Logger
	m        *metrics.Worker
	notifier *outbox.Notifier
	hooks    Hooks
	now      func() time.Time
	dead     *deadletter.DeadLetters
	commit   *committer

	inflight sync.Map // delivery key → jetstream.Msg, for InProgress

	mu        sync.Mutex
	consumers []jetstream.ConsumeContext
	waiting   error // why the worker cannot consume, nil when it can

	durable  jetstream.Consumer // the consumer Run provisioned
	stopping <-chan struct{}    // Run's context's Done
}

// Option configures a Worker.
type Option func(*Worker)

// WithHooks installs test hooks.
func WithHooks(h Hooks) Option { return func(w *Worker) { w.hooks = h } }

// WithClock sets the clock (default time.Now).
func WithClock(now func() time.Time) Option { return func(w *Worker) { w.now = now } }

// WithNotifier signals n after each commit that wrote an outbox event, so
// relays publish it at once. Without it relays find it by polling.
func WithNotifier(n *outbox.Notifier) Option { return func(w *Worker) { w.notifier = n } }

// New returns a worker over pool and nc. nc must be dedicated to the
// worker: the subscriber drains and closes it at shutdown. It returns an
// error when the configuration does not validate.
func New(pool *pgxpool.Pool, nc *nats.Conn, cfg Config, log zerolog.Logger, m *metrics.Worker, opts ...Option) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	w := &Worker{pool: pool, nc: nc, js: js, cfg: cfg, log: log, m: m, now: time.Now}
	for _, o := range opts {
		o(w)
	}
	w.dead = deadletter.New(pool, cfg.Consumer, w.now)
	w.dead.OnWritten = func() { w.m.Message(metrics.WorkerDeadLettered) }
	w.commit = newCommitter(w)
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
	_, err := w.consumer(ctx, w.js)
	return err
}

func (w *Worker) consumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	st, err := js.Stream(ctx, w.cfg.Stream.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("stream %s not found; waiting for a relay to create it: %w", w.cfg.Stream.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("NATS: stream %s: %w", w.cfg.Stream.Name, err)
	}
	c, err := st.CreateOrUpdateConsumer(ctx, w.cfg.ConsumerConfig())
	if err != nil {
		return nil, fmt.Errorf("NATS: consumer %s on stream %s: %w", w.cfg.Consumer, w.cfg.Stream.Name, err)
	}
	return c, nil
}

// Ready reports why the worker cannot consume (the stream missing, the
// consumer not readable), else whether NATS is connected and PostgreSQL
// answers (see metrics.CheckConnected).
func (w *Worker) Ready(ctx context.Context) error {
	w.mu.Lock()
	waiting := w.waiting
	w.mu.Unlock()
	if waiting != nil {
		return waiting
	}
	return metrics.CheckConnected(ctx, w.nc, w.pool)
}

// setWaiting records why the worker cannot consume (nil: it can), logging
// each new reason once.
func (w *Worker) setWaiting(err error) {
	w.mu.Lock()
	prev := w.waiting
	w.waiting = err
	w.mu.Unlock()
	switch {
	case err != nil && (prev == nil || prev.Error() != err.Error()):
		w.log.Warn().Err(err).Str("error_category", "consumer_unavailable").Msg("cannot consume yet; retrying with backoff")
	case err == nil && prev != nil:
		w.log.Info().Str("consumer", w.cfg.Consumer).Msg("consumer ready")
	}
}

// awaitConsumer provisions the consumer, retrying with backoff until it
// succeeds or ctx ends (then it reports false): at start the stream may not
// exist yet, or NATS may be gone for a moment.
func (w *Worker) awaitConsumer(ctx context.Context) (jetstream.Consumer, bool) {
	b := wait.Backoff{Base: consumerBackoffBase, Max: consumerBackoffMax}
	for {
		pctx, cancel := context.WithTimeout(ctx, consumerTimeout)
		c, err := w.consumer(pctx, w.js)
		cancel()
		if err == nil {
			w.setWaiting(nil)
			return c, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		w.setWaiting(err)
		if !wait.For(ctx, b.Next()) {
			return nil, false
		}
	}
}

// pullHeartbeat is the idle heartbeat of each subscription's pull
// requests. A pull request waits on the consumer's leader; when that node
// goes away (a cluster node stopped, a leader election) the request is
// lost without an answer, and the client only notices two missed
// heartbeats later and pulls again. nats.go's default of 30s would leave a
// worker idle that long after each failover.
const pullHeartbeat = 5 * time.Second

// The consumer's provisioning retries from consumerBackoffBase, doubling
// up to consumerBackoffMax, each attempt bounded by consumerTimeout.
const (
	consumerBackoffBase = 100 * time.Millisecond
	consumerBackoffMax  = 5 * time.Second
	consumerTimeout     = 5 * time.Second
)

// resources is the subscriber's ResourceInitializer: the durable consumer
// Run provisioned (awaitConsumer), never deleted at close (other workers
// share it), wrapped so that Run can drain its subscriptions at shutdown.
// It asks NATS nothing: a handler whose subscription failed here would
// keep the router from starting, and from ever closing cleanly.
func (w *Worker) resources(context.Context, jetstream.JetStream, string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
	return &trackedConsumer{Consumer: w.durable, w: w}, nil, nil
}

type trackedConsumer struct {
	jetstream.Consumer
	w *Worker
}

// Consume starts consuming, retrying with backoff while it fails (NATS
// gone between the consumer's creation and this), until Run's context ends
// or the connection is closed.
func (c *trackedConsumer) Consume(h jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	b := wait.Backoff{Base: consumerBackoffBase, Max: consumerBackoffMax}
	for {
		cc, err := c.Consumer.Consume(h, opts...)
		if err == nil {
			c.w.mu.Lock()
			c.w.consumers = append(c.w.consumers, cc)
			c.w.mu.Unlock()
			return cc, nil
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return nil, err
		}
		c.w.setWaiting(fmt.Errorf("NATS: consume %s: %w", c.w.cfg.Consumer, err))
		select {
		case <-c.w.stopping:
			return nil, err
		case <-time.After(b.Next()):
		}
	}
}

// unmarshaler turns a JetStream message into a watermill message carrying
// the delivery metadata (deadletter.Meta*) and remembers the message for
// InProgress. It never fails: the subscriber would dereference a nil message.
type unmarshaler struct{ w *Worker }

const metaKey = "delivery_key"

func (u unmarshaler) Unmarshal(m jetstream.Msg) (*message.Message, error) {
	wm := message.NewMessage(watermill.NewUUID(), m.Data())
	md := wm.Metadata
	md.Set(deadletter.MetaSubject, m.Subject())
	hdr := m.Headers()
	md.Set(deadletter.MetaMsgID, hdr.Get(nats.MsgIdHdr))
	if len(hdr) > 0 {
		if b, err := json.Marshal(map[string][]string(hdr)); err == nil {
			md.Set(deadletter.MetaHeaders, string(b))
		}
	}
	key := watermill.NewShortUUID()
	if meta, err := m.Metadata(); err == nil {
		md.Set(deadletter.MetaStreamSeq, strconv.FormatUint(meta.Sequence.Stream, 10))
		md.Set(deadletter.MetaDeliveries, strconv.FormatUint(meta.NumDelivered, 10))
		md.Set(deadletter.MetaTimestamp, meta.Timestamp.UTC().Format(time.RFC3339Nano))
	}
	md.Set(metaKey, key)
	u.w.inflight.Store(key, m)
	return wm, nil
}

// nakDelay doubles the redelivery delay per delivery up to a cap.
type nakDelay struct{ first, max time.Duration }

func (d nakDelay) WaitTime(delivered uint64) time.Duration {
	t := d.first
	for i := uint64(1); i < delivered && t < d.max; i++ {
		t *= 2
	}
	return min(t, d.max)
}

// deadError marks an error that sends the message to the dead letters:
// permanent for the pipeline, or on the last allowed delivery.
type deadError struct{ err error }

func (e *deadError) Error() string { return e.err.Error() }
func (e *deadError) Unwrap() error { return e.err }

// permanentError is a failure no redelivery can cure (an unparseable
// event); the message goes to the dead letters at once.
type permanentError struct{ msg string }

func (e *permanentError) Error() string { return e.msg }

// Run consumes until ctx ends, then stops fetching, lets the messages in
// flight finish (and be acknowledged) for up to AckWait, and returns nil.
// Until the stream exists and the durable consumer can be created (NATS
// down, no relay has created the stream yet) it retries with backoff, and
// Ready says why; it never returns for that. It returns an error when the
// router cannot be built or stops on its own.
func (w *Worker) Run(ctx context.Context) error {
	w.stopping = ctx.Done()
	durable, ok := w.awaitConsumer(ctx)
	if !ok {
		return nil
	}
	w.durable = durable
	logger := watermillLogger{w.log}
	sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{
		Conn:   w.nc,
		Logger: logger,
		// The subscriber gives up waiting for the handler after this:
		// longer than tracked reports the message in progress, so an
		// acknowledgement is never sent for a message the subscriber
		// has let go of.
		AckWaitTimeout:      progressLimit*w.cfg.AckWait + 5*time.Second,
		ResourceInitializer: w.resources,
		NakDelay:            nakDelay{first: w.cfg.NakDelay, max: w.cfg.MaxNakDelay},
		ConsumeOptions:      []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(w.cfg.Prefetch), jetstream.PullHeartbeat(pullHeartbeat)},
		Unmarshaler:         unmarshaler{w},
	})
	if err != nil {
		return fmt.Errorf("subscriber: %w", err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: w.cfg.AckWait + 5*time.Second}, logger)
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	poison, err := middleware.PoisonQueueWithFilter(w.dead, "dead_letters", func(err error) bool {
		var d *deadError
		return errors.As(err, &d)
	})
	if err != nil {
		return fmt.Errorf("poison queue: %w", err)
	}
	router.AddMiddleware(w.tracked, poison, w.lastDelivery)
	if w.cfg.Retries > 0 {
		router.AddMiddleware(middleware.Retry{
			MaxRetries:      w.cfg.Retries,
			InitialInterval: w.cfg.RetryInterval,
			MaxInterval:     w.cfg.RetryInterval * 8,
			Multiplier:      2,
			MaxElapsedTime:  w.cfg.AckWait / 2,
			ShouldRetry: func(p middleware.RetryParams) bool {
				var perr *permanentError
				return !errors.As(p.Err, &perr) && !errors.Is(p.Err, context.Canceled)
			},
		}.Middleware)
	}
	router.AddMiddleware(middleware.Recoverer)
	for i := range w.cfg.Concurrency {
		// The subscriber handles one message per subscription at a time
		// (its Consume callback waits for the ack), so concurrency is that
		// many subscriptions of the same durable consumer.
		router.AddConsumerHandler(fmt.Sprintf("attachments-%d", i), w.cfg.FilterSubject(), sub, w.process)
	}

	// The committer outlives the router: handlers in flight at shutdown
	// wait for their transactions.
	w.commit.start()
	defer w.commit.close()

	// The router runs on a context of its own: cancelling it would
	// discard the acknowledgements of messages in flight.
	done := make(chan error, 1)
	go func() { done <- router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-router.Running():
	case err := <-done:
		if ctx.Err() != nil {
			// Stopped while Consume was retrying.
			return nil
		}
		return fmt.Errorf("start consuming: %w", err)
	}
	w.log.Info().Str("consumer", w.cfg.Consumer).Str("filter", w.cfg.FilterSubject()).Int("concurrency", w.cfg.Concurrency).
		Int("batch_size", w.cfg.BatchSize).Int("committers", w.cfg.Committers).Msg("consuming")
	select {
	case <-ctx.Done():
	case err := <-done:
		return fmt.Errorf("router stopped: %w", err)
	}
	w.drain()
	if err := router.Close(); err != nil {
		w.log.Warn().Err(err).Msg("router close")
	}
	<-done
	return nil
}

// drain stops fetching and waits until the messages already fetched were
// handled and acknowledged, for up to AckWait.
func (w *Worker) drain() {
	w.mu.Lock()
	ccs := w.consumers
	w.mu.Unlock()
	for _, cc := range ccs {
		cc.Drain()
	}
	deadline := time.After(w.cfg.AckWait)
	for _, cc := range ccs {
		select {
		case <-cc.Closed():
		case <-deadline:
			w.log.Warn().Msg("shutdown: messages still in flight after the ack wait; they will be redelivered")
			return
		}
	}
}

// lastDelivery turns the error of a message's MaxDeliver-th delivery, and a
// permanent pipeline error, into a dead letter; a message delivered more
// than MaxDeliver times becomes one before it is processed again. The
// server's MaxDeliver is unlimited (see ConsumerConfig), so a message whose
// processing kills the process — it never fails, it never returns — would
// otherwise be delivered, and kill the process, for ever.
func (w *Worker) lastDelivery(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		n, _ := strconv.Atoi(msg.Metadata.Get(deadletter.MetaDeliveries))
		if n > w.cfg.MaxDeliver {
			if p, err := parse(msg.Payload); err == nil {
				msg.Metadata.Set(deadletter.MetaEventID, p.id.String())
			}
			w.log.Warn().Str("event_id", msg.Metadata.Get(deadletter.MetaEventID)).Int("deliveries", n).
				Str("error_category", "dead_letter").Msg("delivered more often than allowed: recording a dead letter without processing it")
			return nil, &deadError{fmt.Errorf("delivered %d times, the limit is %d (not processed again)", n, w.cfg.MaxDeliver)}
		}
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		var perr *permanentError
		if errors.As(err, &perr) || n >= w.cfg.MaxDeliver {
			w.log.Warn().Err(err).Str("event_id", msg.Metadata.Get(deadletter.MetaEventID)).Int("deliveries", n).
				Str("error_category", "dead_letter").Msg("giving up on the message: recording a dead letter")
			return out, &deadError{fmt.Errorf("delivery %d: %w", n, err)}
		}
		w.log.Warn().Err(err).Str("event_id", msg.Metadata.Get(deadletter.MetaEventID)).Int("deliveries", n).
			Str("error_category", "transient").Msg("processing failed; the message will be redelivered")
		return out, err
	}
}

// tracked is the outermost middleware: it tells the server the message is
// in progress for as long as the chain inside — in-process retries and
// their waits, the dead letter's write — works on it, up to progressLimit
// AckWaits, and forgets the delivery afterwards. (Reporting from the
// handler itself stopped at its first return, so a retry that outlasted
// AckWait had the message redelivered under it.)
func (w *Worker) tracked(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		key := msg.Metadata.Get(metaKey)
		v, _ := w.inflight.Load(key)
		defer w.inflight.Delete(key)
		if jm, ok := v.(jetstream.Msg); ok {
			// Not the message's context: the router cancels it at
			// shutdown, and an in-flight message is finished, not
			// abandoned. The limit lets the server redeliver a
			// message whose handler hangs.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), progressLimit*w.cfg.AckWait)
			defer cancel()
			stop := w.progress(ctx, jm)
			defer stop()
		}
		return h(msg)
	}
}

// progressLimit is how many AckWaits a message is reported in progress at
// most: more than its attempts can take (each commit waits at most
// AckWait, the retries stop after AckWait/2).
const progressLimit = 4

// progress tells the server every third of AckWait that the message is
// still being worked on, until stop is called.
func (w *Worker) progress(ctx context.Context, m jetstream.Msg) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(w.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := m.InProgress(); err != nil {
					w.log.Debug().Err(err).Msg("in progress")
				}
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// watermillLogger sends watermill's logs to zerolog, one level lower:
// watermill logs every message at info.
type watermillLogger struct{ l zerolog.Logger }

func (a watermillLogger) fields(e *zerolog.Event, f watermill.LogFields) *zerolog.Event {
	for k, v := range f {
		e = e.Interface(k, v)
	}
	return e
}

func (a watermillLogger) Error(msg string, err error, f watermill.LogFields) {
	a.fields(a.l.Warn().Err(err), f).Str("component", "watermill").Msg(msg)
}
func (a watermillLogger) Info(msg string, f watermill.LogFields) {
	a.fields(a.l.Debug(), f).Str("component", "watermill").Msg(msg)
}
func (a watermillLogger) Debug(msg string, f watermill.LogFields) {
	a.fields(a.l.Trace(), f).Str("component", "watermill").Msg(msg)
}
func (a watermillLogger) Trace(msg string, f watermill.LogFields) {
	a.fields(a.l.Trace(), f).Str("component", "watermill").Msg(msg)
}
func (a watermillLogger) With(f watermill.LogFields) watermill.LoggerAdapter {
	c := a.l.With()
	for k, v := range f {
		c = c.Interface(k, v)
	}
	return watermillLogger{c.Logger()}
}
