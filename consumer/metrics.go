package consumer

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of quill_consumer_messages_total.
const (
	// ResultProcessed: the handler's transaction, with the inbox row,
	// committed.
	ResultProcessed = "processed"
	// ResultDuplicate: the inbox already held the event; nothing else was
	// committed and the message was acknowledged.
	ResultDuplicate = "duplicate"
	// ResultDeadLettered: a dead letter was written and the message
	// acknowledged.
	ResultDeadLettered = "dead_lettered"
	// ResultFailed: the delivery failed and the message was Nak'ed for
	// redelivery.
	ResultFailed = "failed"
)

// metrics are one consumer's collectors. A nil *metrics counts nothing.
type metrics struct {
	messages *prometheus.CounterVec
	duration prometheus.Histogram
	running  prometheus.Gauge
	// acks counts the acknowledgements the server confirmed; pending is
	// the durable consumer's backlog as JetStream last reported it, and
	// deadLetters its dead letters not yet re-driven as the table last
	// counted them (pending.go), for quill_consumer_dead_letters and
	// Consumer.DeadLetterCount.
	acks        prometheus.Counter
	pending     prometheus.Gauge
	deadLetters atomic.Int64

	// Group commit (NewBatch) only.
	batchSize *prometheus.HistogramVec
}

// Outcomes of quill_consumer_batch_size.
const (
	batchCommitted = "committed"
	batchFellBack  = "fell_back"
)

func newMetrics(reg prometheus.Registerer, durable, stream string, batched, guarded bool) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"consumer": durable}
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "quill_consumer_messages_total",
			Help:        "Messages handled by the consumer, by result: processed, duplicate, dead_lettered, failed; skipped; with the version guard stale and held_back.",
			ConstLabels: labels,
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "quill_consumer_handler_duration_seconds",
			Help:        "Time of one delivery's handling: its transaction with the handler, in-process retries included.",
			ConstLabels: labels,
			Buckets:     prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "quill_consumer_handlers_running",
			Help:        "Handlers running now.",
			ConstLabels: labels,
		}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_consumer_acks_total",
			Help: "Messages acknowledged to JetStream (the server confirmed): committed, duplicate, skipped or dead-lettered. " +
				"A backlog and no increase is a stalled consumer.",
			ConstLabels: labels,
		}),
		// Exported from New on, at 0 until the first read.
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quill_consumer_pending_messages",
			Help: "Messages the durable consumer has not acknowledged, as JetStream last reported them: " +
				"not yet delivered (num_pending) plus delivered and unacknowledged (num_ack_pending). " +
				"The same on every process of the consumer: aggregate with max.",
			ConstLabels: prometheus.Labels{"consumer": durable, "stream": stream},
		}),
	}
	// Every result is exported from the start, at 0.
	for _, r := range []string{ResultProcessed, ResultDuplicate, ResultDeadLettered, ResultFailed} {
		m.messages.WithLabelValues(r)
	}
	if guarded {
		m.messages.WithLabelValues(ResultStale)
		m.messages.WithLabelValues(ResultHeldBack)
	}
	deadLetters := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "quill_consumer_dead_letters",
		Help: "Dead letters of the consumer not yet re-driven, as the package's table last counted them: " +
			"a retry from the command line or another process's dead letter shows. " +
			"The same on every process of the consumer: aggregate with max.",
		ConstLabels: labels,
	}, func() float64 { return float64(m.deadLetters.Load()) })
	cs := []prometheus.Collector{m.messages, m.duration, m.running, m.acks, m.pending, deadLetters}
	if batched {
		m.batchSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "quill_consumer_batch_size",
			Help: "Deliveries per group-commit transaction, duplicates included, by outcome: committed, " +
				"or fell_back (rolled back; its events were then handled one by one).",
			ConstLabels: labels,
			Buckets:     []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}, []string{"outcome"})
		m.batchSize.WithLabelValues(batchCommitted)
		m.batchSize.WithLabelValues(batchFellBack)
		cs = append(cs, m.batchSize)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("consumer: metrics of consumer %q are registered already: %w", durable, err)
			}
			return nil, fmt.Errorf("consumer: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) count(result string) {
	if m != nil {
		m.messages.WithLabelValues(result).Inc()
	}
}

func (m *metrics) observe(seconds float64) {
	if m != nil {
		m.duration.Observe(seconds)
	}
}

func (m *metrics) runningAdd(d float64) {
	if m != nil {
		m.running.Add(d)
	}
}

func (m *metrics) batch(outcome string, size int) {
	if m != nil && m.batchSize != nil {
		m.batchSize.WithLabelValues(outcome).Observe(float64(size))
	}
}

func (m *metrics) acked() {
	if m != nil {
		m.acks.Inc()
	}
}

func (m *metrics) setPending(n float64) {
	if m != nil {
		m.pending.Set(n)
	}
}

func (m *metrics) setDeadLetters(n int64) {
	if m != nil {
		m.deadLetters.Store(n)
	}
}
