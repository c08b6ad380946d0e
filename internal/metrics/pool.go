package metrics

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// PoolMain is the pool label of a process's one PostgreSQL pool.
const PoolMain = "main"

// Stater is a PostgreSQL pool's statistics, as *pgxpool.Pool gives them.
type Stater interface {
	Stat() *pgxpool.Stat
}

// PoolCollector exports a pgxpool's statistics as quill_db_pool_* metrics
// with a pool label, read from the pool at each scrape.
type PoolCollector struct {
	pool  Stater
	descs poolDescs
}

type poolDescs struct {
	max, total, acquired, idle, constructing    *prometheus.Desc
	acquires, emptyAcquires, canceled, newConns *prometheus.Desc
	acquireSeconds, emptyWaitSeconds, destroyed *prometheus.Desc
}

var _ prometheus.Collector = (*PoolCollector)(nil)

// NewPoolCollector returns the collector of pool's statistics, labelled
// pool=name; register it on the process's registry. Every process opens
// one pool (PoolMain); the relay's claim and LISTEN sessions are single
// connections, not pools.
func NewPoolCollector(name string, pool Stater) *PoolCollector {
	l := prometheus.Labels{"pool": name}
	d := func(metric, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("quill_db_pool_"+metric, help, labels, l)
	}
	return &PoolCollector{pool: pool, descs: poolDescs{
		max:          d("max_conns", "Most connections the pool opens (its size)."),
		total:        d("total_conns", "Connections open now: acquired, idle and being opened."),
		acquired:     d("acquired_conns", "Connections in use now; acquired / max is the pool's saturation."),
		idle:         d("idle_conns", "Connections open and idle now."),
		constructing: d("constructing_conns", "Connections being opened now."),
		acquires:     d("acquires_total", "Connections acquired from the pool, successfully."),
		emptyAcquires: d("empty_acquires_total",
			"Successful acquires that had to wait: no idle connection and the pool at its size (or opening one)."),
		canceled: d("canceled_acquires_total", "Acquires given up by their caller (a deadline, a cancelled request) before a connection was free."),
		newConns: d("new_conns_total", "Connections the pool opened."),
		acquireSeconds: d("acquire_seconds_total",
			"Seconds spent in successful acquires, waits included; divided by acquires_total, the mean acquire time."),
		emptyWaitSeconds: d("empty_acquire_wait_seconds_total", "Seconds successful acquires spent waiting for a connection to become free."),
		destroyed:        d("destroyed_conns_total", "Connections the pool closed, by reason: max_lifetime or max_idle_time.", "reason"),
	}}
}

// Describe sends the collector's descriptors.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	d := c.descs
	for _, desc := range []*prometheus.Desc{d.max, d.total, d.acquired, d.idle, d.constructing,
		d.acquires, d.emptyAcquires, d.canceled, d.newConns, d.acquireSeconds, d.emptyWaitSeconds, d.destroyed} {
		ch <- desc
	}
}

// Collect reads the pool's statistics once and sends them.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	s, d := c.pool.Stat(), c.descs
	gauge := func(desc *prometheus.Desc, v int32) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(v))
	}
	counter := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, labels...)
	}
	gauge(d.max, s.MaxConns())
	gauge(d.total, s.TotalConns())
	gauge(d.acquired, s.AcquiredConns())
	gauge(d.idle, s.IdleConns())
	gauge(d.constructing, s.ConstructingConns())
	counter(d.acquires, float64(s.AcquireCount()))
	counter(d.emptyAcquires, float64(s.EmptyAcquireCount()))
	counter(d.canceled, float64(s.CanceledAcquireCount()))
	counter(d.newConns, float64(s.NewConnsCount()))
	counter(d.acquireSeconds, s.AcquireDuration().Seconds())
	counter(d.emptyWaitSeconds, s.EmptyAcquireWaitTime().Seconds())
	counter(d.destroyed, float64(s.MaxLifetimeDestroyCount()), "max_lifetime")
	counter(d.destroyed, float64(s.MaxIdleDestroyCount()), "max_idle_time")
}
