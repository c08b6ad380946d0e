// Package metrics defines the Prometheus metrics of Quill's processes (SPEC
// §8) on a registry the caller owns — among them a collector of a pgxpool's
// statistics and the worker's dead-letter count, read from the database —
// and serves the admin endpoints every process exposes: /healthz, /readyz
// and /metrics.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/buildinfo"
)

// API holds the API's counters. Requests, business effects and replays are
// kept apart: more requests may be transport retries, not more notes.
type API struct {
	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	idempotency  *prometheus.CounterVec
	effects      *prometheus.CounterVec

	// The vectors' children by their label values, so that a request
	// finds its series without the vector hashing the values and taking
	// its lock every time (issue 29).
	requestsBy    children[[3]string, prometheus.Counter]
	durationBy    children[[2]string, prometheus.Observer]
	idempotencyBy children[[2]string, prometheus.Counter]
	effectsBy     children[string, prometheus.Counter]
}

// children is a vector's children by label values: a map read without a
// lock, copied on the rare write of a series not seen before — the label
// values are the API's own (route patterns, methods, codes, actions and
// outcomes), few and fixed, never a client's.
type children[K comparable, M any] struct {
	mu sync.Mutex // serialises the writes
	m  atomic.Pointer[map[K]M]
}

// get returns k's child, made by vec's own lookup (with) the first time.
func (c *children[K, M]) get(k K, with func(K) M) M {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	v := with(k)
	next := make(map[K]M, 1+len(ptrMap(old)))
	maps.Copy(next, ptrMap(old))
	next[k] = v
	c.m.Store(&next)
	return v
}

// ptrMap is *m, or nil for a nil m.
func ptrMap[K comparable, M any](m *map[K]M) map[K]M {
	if m == nil {
		return nil
	}
	return *m
}

// NewAPI registers the API metrics on reg, with every known action and
// outcome initialised to zero so that rates work from the first scrape.
func NewAPI(reg prometheus.Registerer, actions ...string) *API {
	m := &API{
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_http_requests_total",
			Help: "HTTP requests answered, by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quill_http_request_duration_seconds",
			Help:    "Seconds from a request's arrival to the end of its response, by route pattern and method.",
			Buckets: httpDurationBuckets,
		}, []string{"route", "method"}),
		idempotency: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_idempotency_requests_total",
			Help: "Write requests by action and idempotency outcome (executed, replayed, key_reused, in_progress, expired).",
		}, []string{"action", "outcome"}),
		effects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_business_effects_total",
			Help: "Committed business effects by action; one per effect however often it was requested.",
		}, []string{"action"}),
	}
	reg.MustRegister(m.httpRequests, m.httpDuration, m.idempotency, m.effects)
	for _, a := range actions {
		m.effects.WithLabelValues(a)
		for _, o := range contract.Outcomes() {
			m.idempotency.WithLabelValues(a, o)
		}
	}
	return m
}

// Idempotency counts one write request's idempotency outcome.
func (m *API) Idempotency(action, outcome string) {
	m.idempotencyBy.get([2]string{action, outcome}, m.idempotencyChild).Inc()
}

func (m *API) idempotencyChild(k [2]string) prometheus.Counter {
	return m.idempotency.WithLabelValues(k[0], k[1])
}

// BusinessEffect counts one committed business effect.
func (m *API) BusinessEffect(action string) {
	m.effectsBy.get(action, m.effectChild).Inc()
}

func (m *API) effectChild(action string) prometheus.Counter { return m.effects.WithLabelValues(action) }

// httpDurationBuckets are quill_http_request_duration_seconds's buckets. A
// write is a transaction of a few milliseconds; the upper buckets hold the
// requests that waited — for a concurrent request with the same key
// (QUILL_IDEMPOTENCY_WAIT, 2s by default), for a row lock or a connection —
// and slow bodies, up to QUILL_WRITE_TIMEOUT's 60s.
var httpDurationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// HTTPRequest counts one answered HTTP request and observes its duration.
func (m *API) HTTPRequest(route, method string, code int, d time.Duration) {
	m.requestsBy.get([3]string{route, method, statusLabel(code)}, m.requestsChild).Inc()
	m.durationBy.get([2]string{route, method}, m.durationChild).Observe(d.Seconds())
}

func (m *API) requestsChild(k [3]string) prometheus.Counter {
	return m.httpRequests.WithLabelValues(k[0], k[1], k[2])
}

func (m *API) durationChild(k [2]string) prometheus.Observer {
	return m.httpDuration.WithLabelValues(k[0], k[1])
}

// statusLabel is code's decimal text; the codes HTTP defines come from a
// table made once, since strconv.Itoa allocates every three-digit one.
func statusLabel(code int) string {
	if code >= 100 && code < 100+len(statusLabels) {
		return statusLabels[code-100]
	}
	return strconv.Itoa(code)
}

// statusLabels are the labels of the codes 100 to 599.
var statusLabels = func() []string {
	out := make([]string, 500)
	for i := range out {
		out[i] = strconv.Itoa(100 + i)
	}
	return out
}()

// NewRegistry returns a registry with the Go runtime and process collectors
// and quill_build_info.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfo(buildinfo.Read()))
	return reg
}

// newBuildInfo is quill_build_info for info: a gauge of 1 whose labels say
// what the process runs, the same version that --version prints.
func newBuildInfo(info buildinfo.Info) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "quill_build_info",
		Help:        "Always 1; the labels name the module version and the Go version the process was built with.",
		ConstLabels: prometheus.Labels{"version": info.Version, "goversion": info.GoVersion},
	})
	g.Set(1)
	return g
}

// ReadyFunc checks that a dependency is reachable.
type ReadyFunc func(ctx context.Context) error

// Pinger is a PostgreSQL pool, as *pgxpool.Pool is.
type Pinger interface {
	Ping(ctx context.Context) error
}

// NotReadyError is a readiness failure whose Reason /readyz may show to
// whoever can reach the admin address: a fixed phrase such as "database
// unreachable", never a dependency's own error text, which names hosts,
// users and databases. Err, the detail, goes to the log only.
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *NotReadyError) Unwrap() error { return e.Err }

// Reasons of PingReady and CheckConnected. CheckConnected's name the
// dependency, as its check stands for two of them under the process's
// name ("relay: nats: not connected").
const (
	ReasonDatabaseUnreachable = "database unreachable"
	ReasonPostgresUnreachable = "postgres: " + ReasonDatabaseUnreachable
	ReasonNATSNotConnected    = "nats: not connected"
)

// PingReady is the readiness of a PostgreSQL pool: a *NotReadyError with
// ReasonDatabaseUnreachable when Ping fails.
func PingReady(pool Pinger) ReadyFunc {
	return func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return &NotReadyError{Reason: ReasonDatabaseUnreachable, Err: err}
		}
		return nil
	}
}

// CheckConnected is the readiness of a daemon that needs NATS and
// PostgreSQL: a *NotReadyError with ReasonNATSNotConnected (the detail
// names the connection's status) when nc is not connected, or with
// ReasonPostgresUnreachable when pool's Ping fails, and nil otherwise.
func CheckConnected(ctx context.Context, nc *nats.Conn, pool Pinger) error {
	if s := nc.Status(); s != nats.CONNECTED {
		return &NotReadyError{Reason: ReasonNATSNotConnected, Err: fmt.Errorf("nats: %s", s)}
	}
	if err := pool.Ping(ctx); err != nil {
		return &NotReadyError{Reason: ReasonPostgresUnreachable, Err: err}
	}
	return nil
}

// readyTimeout bounds /readyz's checks.
const readyTimeout = 2 * time.Second

// publicReason is what /readyz shows of a failed check: a NotReadyError's
// Reason; else the text that the error's own wrapper added in front of
// the error it wraps ("stream X not found; waiting for a relay to create
// it" of "…: nats: stream not found"), which Quill's code wrote and which
// carries no dependency's detail; else only "not ready".
func publicReason(err error) string {
	var nr *NotReadyError
	if errors.As(err, &nr) {
		return nr.Reason
	}
	msg := err.Error()
	if inner := errors.Unwrap(err); inner != nil {
		if outer, ok := strings.CutSuffix(msg, ": "+inner.Error()); ok && outer != "" {
			return outer
		}
	}
	return "not ready"
}

// AdminHandler serves /healthz (the process is alive), /readyz (every check
// passes within two seconds; the body names the first that fails, with a
// reason that holds no connection details — the error itself is logged on
// log, once per failed probe) and /metrics from reg.
func AdminHandler(log zerolog.Logger, reg *prometheus.Registry, checks map[string]ReadyFunc) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for name, check := range checks {
			if err := check(ctx); err != nil {
				log.Warn().Err(err).Str("check", name).Str("error_category", "not_ready").Msg("readiness check failed")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(name + ": " + publicReason(err) + "\n"))
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// Relay holds the relay's metrics (see NewRelay for each one's name and
// meaning).
type Relay struct {
	Pending    prometheus.Gauge   // quill_outbox_pending_events
	OldestAge  prometheus.Gauge   // quill_outbox_oldest_pending_age_seconds
	Published  prometheus.Counter // quill_relay_published_total
	Errors     prometheus.Counter // quill_relay_publish_errors_total
	Duplicates prometheus.Counter // quill_relay_duplicates_total
	// Parked is the number of parked events: unpublished, and left alone
	// by every relay until an operator retries them.
	Parked prometheus.Gauge // quill_relay_parked_events
	// Reprovisions counts the times the relay found the stream gone
	// while publishing and provisioned it again.
	Reprovisions prometheus.Counter // quill_relay_stream_reprovisions_total
}

// NewRelay registers the relay's metrics on reg; all start at zero.
func NewRelay(reg prometheus.Registerer) *Relay {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &Relay{
		Pending: gauge("quill_outbox_pending_events",
			"Committed events not yet published (parked ones included), in the whole outbox: every relay reports the same value, aggregate with max, not sum."),
		OldestAge: gauge("quill_outbox_oldest_pending_age_seconds",
			"Age of the oldest unpublished event; 0 when none. Database-wide: aggregate with max, not sum."),
		Parked: gauge("quill_relay_parked_events",
			"Parked events (unpublished, waiting for an operator's retry). Database-wide: aggregate with max, not sum."),
		Published:  counter("quill_relay_published_total", "Events the stream acknowledged, duplicates included."),
		Errors:     counter("quill_relay_publish_errors_total", "Publish attempts that failed (transient or permanent)."),
		Duplicates: counter("quill_relay_duplicates_total", "Acknowledgements JetStream marked duplicate: an event republished within the duplicate window."),
		Reprovisions: counter("quill_relay_stream_reprovisions_total",
			"Times the relay found the stream missing (no responders, stream not found) while publishing and provisioned it again."),
	}
	reg.MustRegister(m.Pending, m.OldestAge, m.Parked, m.Published, m.Errors, m.Duplicates, m.Reprovisions)
	return m
}

// Worker results of quill_worker_messages_total.
const (
	WorkerProcessed    = "processed"
	WorkerDuplicate    = "duplicate"
	WorkerSkipped      = "skipped"
	WorkerFailed       = "failed"
	WorkerDeadLettered = "dead_lettered"
)

// Worker holds the attachment worker's metrics.
type Worker struct {
	messages *prometheus.CounterVec
	// EndToEnd observes, per processed event, the seconds from the event's
	// CloudEvents time (its outbox transaction) to the worker's commit.
	EndToEnd prometheus.Histogram
}

// NewWorker registers the worker's metrics on reg, every result at zero.
func NewWorker(reg prometheus.Registerer) *Worker {
	m := &Worker{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_worker_messages_total",
			Help: "Messages the attachment worker finished, by result (processed, duplicate, skipped, failed, dead_lettered).",
		}, []string{"result"}),
		EndToEnd: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "quill_event_end_to_end_seconds",
			Help:    "Seconds from an event's outbox commit (its CloudEvents time) to the worker's commit of its effect.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
	}
	reg.MustRegister(m.messages, m.EndToEnd)
	for _, r := range []string{WorkerProcessed, WorkerDuplicate, WorkerSkipped, WorkerFailed, WorkerDeadLettered} {
		m.messages.WithLabelValues(r)
	}
	return m
}

// Message counts one finished message with its result.
func (m *Worker) Message(result string) { m.messages.WithLabelValues(result).Inc() }

// Messages returns the counter of one result, for tests and benchmarks.
func (m *Worker) Messages(result string) prometheus.Counter {
	return m.messages.WithLabelValues(result)
}
