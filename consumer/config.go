package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quillhq/quill/contract"
)

// Defaults of Config.
const (
	// DefaultStream is Quill's stream (QUILL_STREAM's default).
	DefaultStream = contract.DefaultStream
	// DefaultFilterSubject is every event of every tenant under Quill's
	// default subject prefix.
	DefaultFilterSubject = contract.DefaultSubjectPrefix + ".>"
	// DefaultConcurrency is the handlers run at once by one process.
	DefaultConcurrency = 4
	// DefaultAckWait is the durable consumer's ack wait.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver is the deliveries after which a failing event
	// becomes a dead letter.
	DefaultMaxDeliver = 10
	// DefaultMaxAckPending bounds the messages delivered and not yet
	// acknowledged across every process of the durable consumer
	// (JetStream's own default).
	DefaultMaxAckPending = 1000
	// DefaultRetries is how often a failing handler is retried in process
	// before the message is Nak'ed.
	DefaultRetries = 2
	// DefaultRetryInterval is the first in-process retry's delay, doubled
	// for each further retry.
	DefaultRetryInterval = 100 * time.Millisecond
	// DefaultNakDelay is the redelivery delay after a failed first
	// delivery, doubled per further delivery up to DefaultMaxNakDelay.
	DefaultNakDelay    = time.Second
	DefaultMaxNakDelay = time.Minute
	// DefaultShutdownTimeout is how long Run lets running handlers finish
	// after its context ended before it cancels theirs.
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultMaxBatch is the most events NewBatch's consumer commits in
	// one transaction.
	DefaultMaxBatch = 32
	// DefaultMaxBatchWait is how long a batch waits for more deliveries
	// after its first: short, since every event of the batch waits with it.
	DefaultMaxBatchWait = 2 * time.Millisecond
	// DefaultPendingInterval is how often Run reads the durable
	// consumer's backlog from JetStream (quill_consumer_pending_messages)
	// and counts its dead letters (quill_consumer_dead_letters):
	// Prometheus's usual scrape interval.
	DefaultPendingInterval = 15 * time.Second
)

// Config configures a Consumer. Every zero field takes its default.
type Config struct {
	// Durable is the durable JetStream consumer's name, also the name its
	// inbox rows and dead letters are kept under. Required; several
	// processes with the same Durable share its messages.
	Durable string
	// Stream is the JetStream stream to consume. Default QUILL_EVENTS.
	// The consumer never creates it (Quill's relay does); it waits for it.
	Stream string
	// FilterSubjects are the subjects consumed, NATS wildcards allowed,
	// e.g. quill.*.note.created. Default quill.> (every event).
	FilterSubjects []string
	// Concurrency is the most handlers this process runs at once, and the
	// most messages it holds: it fetches no more than it has free
	// handlers for. Default 4.
	Concurrency int
	// AckWait is the durable consumer's ack wait. A message whose handler
	// runs longer is reported in progress every third of it. Default 30s.
	AckWait time.Duration
	// MaxDeliver is the number of deliveries after which a failing message
	// becomes a dead letter; one delivered more often (its handler crashed
	// the process each time) becomes one before it is handled again.
	// Default 10.
	MaxDeliver int
	// MaxAckPending is the durable consumer's MaxAckPending. Default 1000.
	MaxAckPending int
	// Retries is how often a failing handler is retried in process, in a
	// new transaction each time, before the message is Nak'ed. Default 2;
	// negative means none.
	Retries int
	// RetryInterval is the first in-process retry's delay, doubled each
	// time. Default 100ms.
	RetryInterval time.Duration
	// NakDelay is the redelivery delay after the first failed delivery,
	// doubled per delivery up to MaxNakDelay. Defaults 1s and 1m.
	NakDelay, MaxNakDelay time.Duration
	// HandlerTimeout bounds one delivery's handling, in-process retries
	// included: its context is cancelled then, and the message is no
	// longer reported in progress. Default 4 × AckWait.
	HandlerTimeout time.Duration
	// ShutdownTimeout is how long Run, once its context ended, lets the
	// running handlers finish before it cancels their contexts (their
	// transactions roll back and the messages are Nak'ed for another
	// process). Default 10s.
	ShutdownTimeout time.Duration
	// OrderBySubject serialises the events of one subject — one note: at
	// most one runs at a time, in the order this process received them
	// (stream order). Without it two events of one note may run at once.
	// See the package documentation for what it does not promise.
	OrderBySubject bool
	// TablePrefix prefixes the inbox and dead-letter tables; it must be
	// the prefix given to Migrate. Default DefaultTablePrefix.
	TablePrefix string
	// Validate, when set, checks each parsed event before its transaction
	// begins (a JSON Schema check of its data, say). An error makes the
	// message a dead letter at once with the error as reason.
	Validate func(Event) error
	// Logger receives the consumer's logs. Default: none.
	Logger *slog.Logger
	// Registerer, when set, receives the consumer's metrics
	// (quill_consumer_*), labelled with Durable.
	Registerer prometheus.Registerer
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// PendingInterval is how often Run reads what waits: the durable
	// consumer's info from JetStream for quill_consumer_pending_messages,
	// and its dead letters not yet re-driven in the package's table for
	// quill_consumer_dead_letters (only with a Registerer). Default 15s.
	PendingInterval time.Duration

	// MaxBatch is the most events a consumer made by NewBatch commits in
	// one transaction (group commit). Default 32; 1 turns batching off.
	// A batch never holds more than Concurrency events, so raise
	// Concurrency with it. New's consumer ignores it.
	MaxBatch int
	// MaxBatchWait is how long a batch waits, after its first delivery,
	// for more to join it before its transaction begins. Default 2ms.
	// New's consumer ignores it.
	MaxBatchWait time.Duration
	// BatchTimeout bounds one batch's transaction: past it the batch rolls
	// back and its events are handled one by one, each within what is
	// left of HandlerTimeout. Default a quarter of HandlerTimeout; it must
	// be below HandlerTimeout. It also bounds Stages.Prepare of a batch.
	// New's consumer ignores it.
	BatchTimeout time.Duration
	// MaxConcurrentBatches bounds the group-commit transactions in flight
	// at once (each holds a connection). A batch ready to commit while
	// that many are in flight waits for one to end, and meanwhile keeps
	// taking deliveries, up to MaxBatch: under load batches grow instead
	// of queueing. Default 0: no bound. New's consumer ignores it.
	MaxConcurrentBatches int
	// Weight, when set, weighs each event (for instance the bytes its
	// effect keeps in memory until the commit); a batch stops taking
	// deliveries once their weights reach MaxBatchWeight. New's consumer
	// ignores it.
	Weight func(Event) int64
	// MaxBatchWeight is the weight at which a batch is full. Default 0:
	// no bound.
	MaxBatchWeight int64

	// Versions selects the version guard: VersionsOff (the default, no
	// guard), VersionsSkipStale (skip what is not newer; for a consumer
	// of only some note types) or VersionsInOrder (skip what is not
	// newer, hold back what comes early; for a consumer of every note
	// event). It needs the versions table of Migrate.
	Versions VersionGuard
	// HoldBackDelay is the redelivery delay of an event VersionsInOrder
	// holds back, on its first delivery, doubled per delivery up to
	// MaxNakDelay. Default 200ms.
	HoldBackDelay time.Duration

	// Inbox, when set, replaces the package's inbox table: for a service
	// that already keeps one of its own. Default: the table of Migrate.
	Inbox Inbox
	// DeadLetters, when set, replaces the package's dead-letter table: for
	// a service whose operators already list and re-drive dead letters
	// from a table of its own. Default: the table of Migrate.
	DeadLetters DeadLetterWriter
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	if len(c.FilterSubjects) == 0 {
		c.FilterSubjects = []string{DefaultFilterSubject}
	}
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, DefaultMaxDeliver)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, DefaultMaxAckPending)
	c.Retries = cmp.Or(c.Retries, DefaultRetries)
	c.RetryInterval = cmp.Or(c.RetryInterval, DefaultRetryInterval)
	c.NakDelay = cmp.Or(c.NakDelay, DefaultNakDelay)
	c.MaxNakDelay = cmp.Or(c.MaxNakDelay, DefaultMaxNakDelay)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, 4*c.AckWait)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.TablePrefix = cmp.Or(c.TablePrefix, DefaultTablePrefix)
	c.MaxBatch = cmp.Or(c.MaxBatch, DefaultMaxBatch)
	c.MaxBatchWait = cmp.Or(c.MaxBatchWait, DefaultMaxBatchWait)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, c.HandlerTimeout/4)
	c.PendingInterval = cmp.Or(c.PendingInterval, DefaultPendingInterval)
	c.HoldBackDelay = cmp.Or(c.HoldBackDelay, DefaultHoldBackDelay)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports the first setting that cannot work, naming its field.
func (c Config) validate() error {
	switch {
	case c.Durable == "":
		return errors.New("consumer: Config.Durable is required")
	case strings.ContainsAny(c.Durable, ". *>\t\r\n"):
		return fmt.Errorf("consumer: Config.Durable %q must not contain '.', '*', '>' or white space", c.Durable)
	case strings.ContainsAny(c.Stream, ". *>\t\r\n"):
		return fmt.Errorf("consumer: Config.Stream %q must not contain '.', '*', '>' or white space", c.Stream)
	case c.Concurrency < 1:
		return fmt.Errorf("consumer: Config.Concurrency %d must be at least 1", c.Concurrency)
	case c.AckWait < time.Second:
		return fmt.Errorf("consumer: Config.AckWait %s must be at least 1s", c.AckWait)
	case c.MaxDeliver < 1:
		return fmt.Errorf("consumer: Config.MaxDeliver %d must be at least 1", c.MaxDeliver)
	case c.MaxAckPending < c.Concurrency:
		return fmt.Errorf("consumer: Config.MaxAckPending %d must be at least Config.Concurrency %d", c.MaxAckPending, c.Concurrency)
	case c.RetryInterval < 0, c.NakDelay < 0, c.MaxNakDelay < c.NakDelay:
		return errors.New("consumer: Config.RetryInterval and Config.NakDelay must not be negative, Config.MaxNakDelay not below Config.NakDelay")
	case c.HandlerTimeout < c.AckWait/3:
		return fmt.Errorf("consumer: Config.HandlerTimeout %s must be at least a third of Config.AckWait %s", c.HandlerTimeout, c.AckWait)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("consumer: Config.ShutdownTimeout %s must not be negative", c.ShutdownTimeout)
	case c.MaxBatch < 1:
		return fmt.Errorf("consumer: Config.MaxBatch %d must be at least 1", c.MaxBatch)
	case c.MaxBatchWait < 0:
		return fmt.Errorf("consumer: Config.MaxBatchWait %s must not be negative", c.MaxBatchWait)
	case c.BatchTimeout <= 0 || c.BatchTimeout >= c.HandlerTimeout:
		return fmt.Errorf("consumer: Config.BatchTimeout %s must be positive and below Config.HandlerTimeout %s", c.BatchTimeout, c.HandlerTimeout)
	case c.MaxConcurrentBatches < 0:
		return fmt.Errorf("consumer: Config.MaxConcurrentBatches %d must not be negative", c.MaxConcurrentBatches)
	case c.MaxBatchWeight < 0:
		return fmt.Errorf("consumer: Config.MaxBatchWeight %d must not be negative", c.MaxBatchWeight)
	case c.PendingInterval < 0:
		return fmt.Errorf("consumer: Config.PendingInterval %s must not be negative", c.PendingInterval)
	case c.Versions != VersionsOff && c.Versions != VersionsSkipStale && c.Versions != VersionsInOrder:
		return fmt.Errorf("consumer: Config.Versions %q must be %q, %q or %q", c.Versions, VersionsOff, VersionsSkipStale, VersionsInOrder)
	case c.HoldBackDelay < 0:
		return fmt.Errorf("consumer: Config.HoldBackDelay %s must not be negative", c.HoldBackDelay)
	}
	for _, s := range c.FilterSubjects {
		if s == "" || strings.ContainsAny(s, " \t\r\n") || strings.Contains(s, "..") {
			return fmt.Errorf("consumer: Config.FilterSubjects: %q is not a subject", s)
		}
	}
	if _, err := tablesOf(c.TablePrefix); err != nil {
		return fmt.Errorf("consumer: Config.TablePrefix: %w", err)
	}
	return nil
}

// ConsumerConfig is the durable consumer New's consumer creates, or
// updates, on the stream.
//
// MaxDeliver is unlimited on the server, and there is no server BackOff:
// the consumer counts deliveries itself and writes the dead letter. A
// server that stopped at MaxDeliver would drop a message whose last
// delivery failed while PostgreSQL was down — when its dead letter could
// not be written either.
func (c Config) ConsumerConfig() jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       c.Durable,
		Description:   "Quill events consumer (github.com/quillhq/quill/consumer)",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
	}
	if len(c.FilterSubjects) == 1 {
		cc.FilterSubject = c.FilterSubjects[0]
	} else {
		cc.FilterSubjects = c.FilterSubjects
	}
	return cc
}

// nakDelay is the redelivery delay after a failed delivery number n:
// NakDelay doubled per delivery after the first, up to MaxNakDelay.
func (c Config) nakDelay(n int) time.Duration {
	d := c.NakDelay
	for i := 1; i < n && d < c.MaxNakDelay; i++ {
		d *= 2
	}
	return min(d, c.MaxNakDelay)
}

// awaitingEarlier reports whether VersionsInOrder still holds back, on its
// delivery number n, the first event the consumer sees of a note whose
// version is above 1: until the hold-back delays of its deliveries so far
// add up to 1.5 × AckWait — long enough for an earlier version fetched
// before it by a process that stopped without acknowledging to be
// redelivered — and never at its last delivery before MaxDeliver, so that
// the wait never makes a dead letter of it.
func (c Config) awaitingEarlier(n int) bool {
	if n >= c.MaxDeliver-1 {
		return false
	}
	var waited time.Duration
	for i := 1; i < n; i++ {
		waited += c.holdBackDelay(i)
	}
	return waited < c.AckWait*3/2
}

// holdBackDelay is the redelivery delay of an event held back on delivery
// number n: HoldBackDelay doubled per delivery after the first, up to
// MaxNakDelay.
func (c Config) holdBackDelay(n int) time.Duration {
	d := c.HoldBackDelay
	for i := 1; i < n && d < c.MaxNakDelay; i++ {
		d *= 2
	}
	return min(d, c.MaxNakDelay)
}
