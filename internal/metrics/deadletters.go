package metrics

import "github.com/prometheus/client_golang/prometheus"

// RegisterWorkerDeadLetters registers quill_worker_dead_letters (SPEC §8)
// on reg: the worker's consumer's dead letters not yet retried, as count
// returns them at each scrape — the consumer package's own count
// (consumer.Consumer.DeadLetterCount, quill_consumer_dead_letters), read
// from the database by its poll, so a scrape never waits for the
// database and the two gauges never disagree.
func RegisterWorkerDeadLetters(reg prometheus.Registerer, count func() int64) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "quill_worker_dead_letters",
		Help: "Dead letters of this worker's consumer not yet retried, read from the database: every worker of the consumer reports the same value, aggregate with max, not sum.",
	}, func() float64 { return float64(count()) }))
}
