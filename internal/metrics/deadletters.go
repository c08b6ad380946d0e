package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// DefaultDeadLetterInterval is how often DeadLetters reads the count.
const DefaultDeadLetterInterval = 5 * time.Second

// deadLetterQueryTimeout bounds one count, so that a hung database does
// not hold the loop past its next turn.
const deadLetterQueryTimeout = 2 * time.Second

// sqlDeadLettersOpen counts a consumer's dead letters not yet re-driven:
// an index-only walk of dead_letters_open_idx.
const sqlDeadLettersOpen = `SELECT count(*) FROM dead_letters WHERE consumer = $1 AND retried_at IS NULL`

// RowQuerier runs a query returning one row: a pool.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DeadLetters keeps quill_worker_dead_letters — a consumer's dead letters
// not yet retried — by reading the dead_letters table every Interval. It
// is its own service rather than a count kept by the worker: a retry from
// the command line, or another worker's dead letter, changes the table,
// not this process's memory.
type DeadLetters struct {
	gauge    prometheus.Gauge
	db       RowQuerier
	consumer string
	log      zerolog.Logger
	// Interval is the time between two counts; DefaultDeadLetterInterval
	// when zero. Set it before Run.
	Interval time.Duration
}

// NewDeadLetters registers quill_worker_dead_letters on reg, at 0 until
// Run's first count, for consumer's dead letters read through db.
func NewDeadLetters(reg prometheus.Registerer, db RowQuerier, consumer string, log zerolog.Logger) *DeadLetters {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quill_worker_dead_letters",
		Help: "Dead letters of this worker's consumer not yet retried, read from the database: every worker of the consumer reports the same value, aggregate with max, not sum.",
	})
	reg.MustRegister(g)
	return &DeadLetters{gauge: g, db: db, consumer: consumer, log: log}
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
	var n int64
	if err := d.db.QueryRow(qctx, sqlDeadLettersOpen, d.consumer).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}
