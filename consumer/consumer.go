package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// Handler applies one event's effect inside tx, the consumer's own
// transaction, which already holds the event's inbox row. It must write
// through tx only — what it writes elsewhere is not undone on a rollback
// nor protected from a second delivery. Returning nil commits tx and then
// acknowledges the message; an error rolls tx back, and the delivery is
// retried (in process, then by redelivery) until MaxDeliver, unless the
// error is Permanent, which makes the message a dead letter at once. A
// handler should return when ctx is done.
type Handler func(ctx context.Context, tx pgx.Tx, ev Event) error

// Consumer consumes Quill's events from one durable JetStream pull consumer
// and runs a Handler for each, at most Config.Concurrency at once, each in
// a PostgreSQL transaction with the event's inbox row. Make one with New
// and start it with Run.
type Consumer struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	cfg     Config
	store   *Store
	st      Stages
	inbox   Inbox
	log     *slog.Logger
	m       *metrics
	running atomic.Bool

	mu      sync.Mutex
	waiting error // why the consumer cannot consume; nil when it can

	// deadLetters writes the dead letters: Config.DeadLetters or the
	// package's table.
	deadLetters DeadLetterWriter

	// batch gathers deliveries into group commits; nil for New's consumer.
	batch *batcher

	// inflight counts the versions of the deliveries held, per note
	// (VersionsInOrder only).
	inflight inFlight

	// afterCommit, set by tests, runs after a commit and before the
	// acknowledgement; an error stands for a crash in between.
	afterCommit func(Event) error
}

// New returns a Consumer of the events js's stream holds, whose handler
// writes through pool, which must hold the tables of Migrate (with
// cfg.TablePrefix). It returns an error naming the field of cfg that
// cannot work, or when the metrics cannot be registered on
// cfg.Registerer (a second consumer of the same Durable on one registry).
func New(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, h Handler) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("consumer: no handler")
	}
	return newConsumer(pool, js, cfg, Stages{Apply: func(ctx context.Context, tx pgx.Tx, items []*Item) error {
		return h(ctx, tx, items[0].Event) // alone: New's consumer has no batches
	}}, false)
}

// newConsumer is New for any Stages, with the batch-size metrics when
// batched.
func newConsumer(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, st Stages, batched bool) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	switch {
	case pool == nil:
		return nil, errors.New("consumer: no PostgreSQL pool")
	case js == nil:
		return nil, errors.New("consumer: no JetStream")
	case st.Apply == nil:
		return nil, errors.New("consumer: no handler")
	}
	store, err := NewStore(pool, cfg.TablePrefix)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.Durable, cfg.Stream, batched, cfg.Versions != VersionsOff)
	if err != nil {
		return nil, err
	}
	c := &Consumer{pool: pool, js: js, cfg: cfg, store: store, st: st, inbox: cfg.Inbox, deadLetters: cfg.DeadLetters,
		log: cfg.Logger.With("consumer", cfg.Durable), m: m}
	if c.inbox == nil {
		c.inbox = tableInbox{c}
	}
	if c.deadLetters == nil {
		c.deadLetters = tableDeadLetters{c}
	}
	return c, nil
}

// Provision creates the durable consumer on the stream, or updates it to
// Config.ConsumerConfig. It returns an error wrapping
// jetstream.ErrStreamNotFound when the stream does not exist (Quill's relay
// creates it), or NATS's error. Run provisions on its own, retrying.
func (c *Consumer) Provision(ctx context.Context) (jetstream.Consumer, error) {
	st, err := c.js.Stream(ctx, c.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("consumer: stream %s not found; waiting for Quill's relay to create it: %w", c.cfg.Stream, err)
	}
	if err != nil {
		return nil, fmt.Errorf("consumer: NATS: stream %s: %w", c.cfg.Stream, err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, c.cfg.ConsumerConfig())
	if err != nil {
		return nil, fmt.Errorf("consumer: NATS: durable consumer %s on stream %s: %w", c.cfg.Durable, c.cfg.Stream, err)
	}
	return cons, nil
}

// Ready reports why the consumer cannot consume (the stream missing, NATS
// refusing a fetch), else whether NATS is connected and PostgreSQL
// answers: for a readiness probe.
func (c *Consumer) Ready(ctx context.Context) error {
	c.mu.Lock()
	waiting := c.waiting
	c.mu.Unlock()
	if waiting != nil {
		return waiting
	}
	if nc := c.js.Conn(); nc != nil && !nc.IsConnected() {
		return fmt.Errorf("consumer: NATS: %s", nc.Status())
	}
	if err := c.pool.Ping(ctx); err != nil {
		return fmt.Errorf("consumer: PostgreSQL: %w", err)
	}
	return nil
}

// setWaiting records why the consumer cannot consume (nil: it can),
// logging each new reason once.
func (c *Consumer) setWaiting(err error) {
	c.mu.Lock()
	prev := c.waiting
	c.waiting = err
	c.mu.Unlock()
	switch {
	case err != nil && (prev == nil || prev.Error() != err.Error()):
		c.log.Warn("cannot consume yet; retrying with backoff", "error", err)
	case err == nil && prev != nil:
		c.log.Info("consumer ready")
	}
}

// Provisioning and fetch failures are retried from backoffBase, doubling
// up to backoffMax, each provisioning bounded by provisionTimeout.
const (
	backoffBase      = 100 * time.Millisecond
	backoffMax       = 5 * time.Second
	provisionTimeout = 5 * time.Second
)

// awaitConsumer provisions the durable consumer, retrying with backoff
// until it succeeds or ctx ends (then it returns false).
func (c *Consumer) awaitConsumer(ctx context.Context) (jetstream.Consumer, bool) {
	delay := backoffBase
	for {
		pctx, cancel := context.WithTimeout(ctx, provisionTimeout)
		cons, err := c.Provision(pctx)
		cancel()
		if err == nil {
			c.setWaiting(nil)
			return cons, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		c.setWaiting(err)
		if !sleep(ctx, delay) {
			return nil, false
		}
		delay = min(2*delay, backoffMax)
	}
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// routerCloseTimeout bounds the router's close: Run has finished or
// abandoned every delivery by then.
const routerCloseTimeout = 5 * time.Second

// Run consumes until ctx ends, then stops fetching, lets the running
// handlers finish for up to Config.ShutdownTimeout, cancels the contexts of
// those still running (their messages are Nak'ed, to be redelivered), and
// returns nil. Until the durable consumer can be provisioned (the stream
// missing, NATS away) it retries with backoff, and Ready says why. With a
// Config.Registerer it also reads, at once and then every
// Config.PendingInterval for as long as it runs, the durable consumer's
// backlog from JetStream into quill_consumer_pending_messages and its
// dead letters not yet re-driven from the package's table into
// quill_consumer_dead_letters (DeadLetterCount). It returns an error when
// it is called a second time, or when the router cannot start or stops on
// its own.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	if c.m != nil {
		// From the start, before the consumer is provisioned: a durable
		// consumer left by an earlier run shows its backlog and its dead
		// letters at once. Two loops, so that NATS away does not hold up
		// the count in the database, nor the other way round.
		pctx, stopPolling := context.WithCancel(ctx)
		var polls sync.WaitGroup
		polls.Go(func() { c.pollPending(pctx) })
		polls.Go(func() { c.pollDeadLetters(pctx) })
		defer func() { stopPolling(); polls.Wait() }()
	}
	cons, ok := c.awaitConsumer(ctx)
	if !ok {
		return nil
	}
	p := newPool(c, cons)
	defer p.cancelHandlers()

	// Watermill's logs go one level down: the consumer logs what matters
	// itself, and the router logs every failed message as an error.
	logger := watermill.NewSlogLoggerWithLevelMapping(c.log.With("component", "watermill"), map[slog.Level]slog.Level{
		slog.LevelInfo: slog.LevelDebug, slog.LevelError: slog.LevelDebug,
	})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: routerCloseTimeout}, logger)
	if err != nil {
		return fmt.Errorf("consumer: router: %w", err)
	}
	poison, err := middleware.PoisonQueueWithFilter(deadLetters{c}, "dead_letters", func(err error) bool {
		var d *deadError
		return errors.As(err, &d)
	})
	if err != nil {
		return fmt.Errorf("consumer: poison queue: %w", err)
	}
	// Outermost first: the dead letters catch what the delivery check
	// gives up on; the retries run inside it, so a dead letter follows the
	// last in-process attempt; the recoverer turns a handler's panic into
	// an error that the retries and the check see.
	router.AddMiddleware(poison, c.lastDelivery)
	if c.cfg.Retries > 0 {
		router.AddMiddleware(middleware.Retry{
			MaxRetries:      c.cfg.Retries,
			InitialInterval: c.cfg.RetryInterval,
			MaxInterval:     c.cfg.RetryInterval * 8,
			Multiplier:      2,
			MaxElapsedTime:  c.cfg.AckWait / 2,
			ShouldRetry: func(r middleware.RetryParams) bool {
				// Not an event held back: retried in process it would keep
				// its note's turn (OrderBySubject) from the predecessor
				// it waits for.
				return !IsPermanent(r.Err) && !isHeldBack(r.Err) &&
					!errors.Is(r.Err, context.Canceled) && !errors.Is(r.Err, context.DeadlineExceeded)
			},
		}.Middleware)
	}
	router.AddMiddleware(middleware.Recoverer)
	router.AddConsumerHandler("quill-consumer-"+c.cfg.Durable, c.cfg.Stream, p, c.handle)

	// The router runs on a context of its own: cancelling it would drop the
	// acknowledgements of the messages in flight; Run closes it after the
	// pool is drained.
	done := make(chan error, 1)
	go func() {
		err := router.Run(context.WithoutCancel(ctx))
		close(p.routerGone)
		done <- err
	}()
	select {
	case <-router.Running():
	case err := <-done:
		return fmt.Errorf("consumer: router: %w", err)
	}
	fctx, stopFetching := context.WithCancel(ctx)
	fetched := make(chan struct{})
	go func() {
		defer close(fetched)
		p.fetch(fctx)
	}()
	c.log.Info("consuming", "stream", c.cfg.Stream, "filter", c.cfg.FilterSubjects, "concurrency", c.cfg.Concurrency,
		"order_by_subject", c.cfg.OrderBySubject)

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-done:
		runErr = fmt.Errorf("consumer: router stopped: %w", err)
	}
	stopFetching()
	<-fetched
	p.drain()
	if err := router.Close(); err != nil {
		c.log.Warn("router close", "error", err)
	}
	if runErr == nil {
		<-done
	}
	return runErr
}

// TooManyDeliveriesError is the cause of a dead letter written before
// the message was handled again: it was delivered more often than
// Config.MaxDeliver (each time, its handling crashed the process, or its
// dead letter could not be written).
type TooManyDeliveriesError struct {
	Deliveries, Limit int
}

func (e *TooManyDeliveriesError) Error() string {
	return fmt.Sprintf("delivered %d times, the limit is %d (not handled again)", e.Deliveries, e.Limit)
}

// dead marks err as making d a dead letter, and keeps it for the writer.
func (d *delivery) dead(err error) error {
	d.deadErr = err
	return &deadError{err}
}

// deadError marks an error that makes the message a dead letter.
type deadError struct{ err error }

func (e *deadError) Error() string { return e.err.Error() }
func (e *deadError) Unwrap() error { return e.err }

// lastDelivery decides which failures end in a dead letter: a message that
// is not an event (or fails Validate) or whose handler failed Permanently,
// at once; one failing on its MaxDeliver-th delivery; and one delivered
// more often than MaxDeliver, before it is handled again. The server's
// MaxDeliver is unlimited (see Config.ConsumerConfig), so a message whose
// handling kills the process — it never fails, it never returns — would
// otherwise be delivered, and kill the process, for ever.
func (c *Consumer) lastDelivery(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d := deliveryOf(msg.Context())
		n := d.event.Delivery.Deliveries
		if n > c.cfg.MaxDeliver {
			return nil, d.dead(&TooManyDeliveriesError{Deliveries: n, Limit: c.cfg.MaxDeliver})
		}
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		if d.pool.stopping() && msg.Context().Err() != nil {
			return out, err // cut short by the shutdown: Nak'ed for another process
		}
		var panicked middleware.RecoveredPanicError
		if errors.As(err, &panicked) {
			err = fmt.Errorf("handler panicked: %v", panicked.V) // not the stack, in the reason
		}
		var inv *InvalidEventError
		switch {
		case errors.As(err, &inv):
			return out, d.dead(err)
		case IsPermanent(err):
			return out, d.dead(fmt.Errorf("delivery %d: permanent: %w", n, err))
		case n >= c.cfg.MaxDeliver:
			return out, d.dead(fmt.Errorf("delivery %d of at most %d: %w", n, c.cfg.MaxDeliver, err))
		case isHeldBack(err):
			// Expected whenever a note's events arrive out of order.
			d.heldBack = true
			c.log.Debug("event held back for its note's earlier version; it will be redelivered", d.event.logAttrs("deliveries", n, "reason", err)...)
			return out, err
		}
		d.heldBack = false
		c.log.Warn("handling failed; the message will be redelivered", d.event.logAttrs("deliveries", n, "error", err)...)
		return out, err
	}
}

// rollbackTimeout bounds a rollback that outlives the handler's context.
const rollbackTimeout = 5 * time.Second

// handle is the router's handler: one attempt at one delivery.
func (c *Consumer) handle(msg *message.Message) error {
	d := deliveryOf(msg.Context())
	if d.parseErr != nil {
		return d.parseErr
	}
	if c.cfg.Validate != nil {
		if err := c.cfg.Validate(d.event); err != nil {
			return &InvalidEventError{Reason: "invalid event: " + err.Error()}
		}
	}
	start := time.Now()
	c.m.runningAdd(1)
	defer func() {
		c.m.runningAdd(-1)
		c.m.observe(time.Since(start).Seconds())
	}()
	if c.batch != nil {
		return c.batch.handle(msg.Context(), d)
	}
	return c.transact(msg.Context(), d)
}
