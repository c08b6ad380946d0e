package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/consumer"
)

// DefaultDeadLetterInterval is how often DeadLetters reads the count.
const DefaultDeadLetterInterval = 5 * time.Second

// deadLetterQueryTimeout bounds one count, so that a hung database does
// not hold the loop past its next turn.
const deadLetterQueryTimeout = 2 * time.Second

// DeadLetters keeps quill_worker_dead_letters — a consumer's dead letters
// not yet retried — by counting them in the consumer package's table
// (consumer.Store) every Interval. It
// is its own service rather than a count kept by the worker: a retry from
// the command line, or another worker's dead letter, changes the table,
// not this process's memory.
type DeadLetters struct {
	gauge    prometheus.Gauge
	store    *consumer.Store
	consumer string
	log      zerolog.Logger
	// Interval is the time between two counts; DefaultDeadLetterInterval
	// when zero. Set it before Run.
	Interval time.Duration
}

// NewDeadLetters registers quill_worker_dead_letters on reg, at 0 until
// Run's first count, for durable's dead letters in store.
func NewDeadLetters(reg prometheus.Registerer, store *consumer.Store, durable string, log zerolog.Logger) *DeadLetters {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quill_worker_dead_letters",
		Help: "Dead letters of this worker's consumer not yet retried, read from the database: every worker of the consumer reports the same value, aggregate with max, not sum.",
	})
	reg.MustRegister(g)
	return &DeadLetters{gauge: g, store: store, consumer: durable, log: log}
}

// Run counts at once and then every Interval until ctx ends; it returns
// nil then. A failed count keeps the last value and is logged once until
// a count succeeds again (the worker logs the outage itself).
func (d *DeadLetters) Run(ctx context.Context) error {
	interval := d.Interval
	if interval <= 0 {
		interval = DefaultDeadLetterInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		n, err := d.count(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			failing = true
			d.log.Warn().Err(err).Str("error_category", "dead_letter_count_failed").Msg("cannot count the dead letters; quill_worker_dead_letters keeps its last value")
		case err == nil:
			failing = false
			d.gauge.Set(float64(n))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (d *DeadLetters) count(ctx context.Context) (int64, error) {
	qctx, cancel := context.WithTimeout(ctx, deadLetterQueryTimeout)
	defer cancel()
	return d.store.OpenDeadLetters(qctx, d.consumer)
}
