package dispatch

import (
	"github.com/prometheus/client_golang/prometheus"
)

// EndpointStates are the values of quill_webhook_endpoints' state label.
var EndpointStates = []string{"active", "disabled"}

// Metrics are the dispatcher's metrics (SPEC §11).
type Metrics struct {
	// Deliveries counts attempts by result (Results):
	// quill_webhook_deliveries_total{result}.
	Deliveries *prometheus.CounterVec
	// Pending is the deliveries pending in the whole database
	// (quill_webhook_pending): every dispatcher reports the same value,
	// aggregated with max (decision 0057).
	Pending prometheus.Gauge
	// Endpoints is the tenants' endpoints not deleted, by state (active,
	// disabled), in the whole database (quill_webhook_endpoints{state}):
	// aggregated with max like Pending. A disabled endpoint gets nothing
	// until an operator enables it, so it is worth a look.
	Endpoints *prometheus.GaugeVec
	// Latency is the time from the event's commit (its CloudEvents time)
	// to its delivery (quill_webhook_delivery_seconds).
	Latency prometheus.Histogram
}

// NewMetrics registers the dispatcher's metrics on reg, every series at 0
// from the start. It panics when they are registered already.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quill_webhook_deliveries_total",
			Help: "Webhook delivery attempts by result: delivered (2xx), retried (another answer, a timeout, a connection error), failed (the delivery given up: retry horizon, 410 Gone, endpoint disabled), refused (not sent: not https or not a public address)."},
			[]string{"result"}),
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quill_webhook_pending",
			Help: "Webhook deliveries pending in the database (every dispatcher reports the same value: aggregate with max)."}),
		Endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quill_webhook_endpoints",
			Help: "Webhook endpoints not deleted, by state: active, disabled (every dispatcher reports the same values: aggregate with max)."},
			[]string{"state"}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quill_webhook_delivery_seconds",
			Help:    "Time from an event's commit (its CloudEvents time) to its delivery's 2xx answer.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400}}),
	}
	if reg != nil {
		reg.MustRegister(m.Deliveries, m.Pending, m.Endpoints, m.Latency)
	}
	for _, r := range Results {
		m.Deliveries.WithLabelValues(r)
	}
	for _, s := range EndpointStates {
		m.Endpoints.WithLabelValues(s)
	}
	return m
}
