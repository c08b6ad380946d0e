package dispatch_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/dispatch"
)

var (
	created = contract.CloudEventType(contract.EventNoteCreated)
	updated = contract.CloudEventType(contract.EventNoteUpdated)
)

// An event of a subscribed type reaches each subscribed endpoint once, with
// the CloudEvent as it was published as body and a signature that
// verifies; an endpoint of another type, of another tenant, deleted or
// disabled gets nothing.
func TestDeliversSignedEvents(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rcA, rcB, rcOther := &receiver{}, &receiver{}, &receiver{}
	a, secretA := h.endpoint(newServer(t, rcA).URL+"/hook", created, updated)
	b, secretB := h.endpoint(newServer(t, rcB).URL, created)
	other := newServer(t, rcOther).URL
	h.endpoint(other, updated) // another type
	gone, _ := h.endpoint(other, created)
	_, err := h.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET deleted_at = now() WHERE id = $1`, gone)
	require.NoError(t, err)
	disabled, _ := h.endpoint(other, created)
	_, err = h.pool.Exec(t.Context(), `INSERT INTO webhook_endpoint_health (endpoint_id, state) VALUES ($1, 'disabled')`, disabled)
	require.NoError(t, err)
	later, _ := h.endpoint(other, created) // created after the event
	_, err = h.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET created_at = now() + interval '1 hour' WHERE id = $1`, later)
	require.NoError(t, err)

	m, reg := h.start(dispatch.Config{})
	note := uuid.New()
	id, body := h.publish(contract.EventNoteCreated, note, 1)
	ra := h.waitState(a, id, "delivered")
	h.waitState(b, id, "delivered")
	require.Equal(t, 1, ra.Attempts)
	require.Equal(t, 204, *ra.LastStatus)

	for rc, secret := range map[*receiver]string{rcA: secretA, rcB: secretB} {
		got := rc.requests()
		require.Len(t, got, 1)
		require.Equal(t, id, got[0].ID)
		require.Equal(t, body, got[0].Body, "the body is the CloudEvent as published")
		require.Equal(t, "application/cloudevents+json", got[0].ContentType)
		require.Equal(t, dispatch.UserAgent, got[0].UserAgent)
		verify(t, secret, got[0])
	}
	time.Sleep(300 * time.Millisecond)
	require.Empty(t, rcOther.requests())
	var n int
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT count(*) FROM webhook_deliveries`).Scan(&n))
	require.Equal(t, 2, n)
	var version int64
	var agg uuid.UUID
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT aggregate_id, aggregate_version FROM webhook_deliveries WHERE endpoint_id = $1`, a).Scan(&agg, &version))
	require.Equal(t, note, agg)
	require.Equal(t, int64(1), version)

	require.Eventually(t, func() bool { return counter(m.Deliveries.WithLabelValues("delivered")) == 2 }, waitLong, 10*time.Millisecond)
	require.Eventually(t, func() bool { return histogramCount(t, reg, "quill_webhook_delivery_seconds") == 2 }, waitLong, 20*time.Millisecond)
}

// Failed attempts are retried under the same webhook-id until a 2xx;
// the endpoint's health records the failures and then the success.
func TestRetriesUnderTheSameID(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{answer: func(n int, _ request) int {
		if n < 3 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}}
	ep, secret := h.endpoint(newServer(t, rc).URL, created)
	m, _ := h.start(dispatch.Config{BackoffMin: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	r := h.waitState(ep, id, "delivered")
	require.Equal(t, 3, r.Attempts)
	require.Equal(t, []string{id, id, id}, rc.ids())
	for _, req := range rc.requests() {
		verify(t, secret, req)
	}
	require.Eventually(t, func() bool { return counter(m.Deliveries.WithLabelValues("retried")) == 2 }, waitLong, 10*time.Millisecond)
	var failures int
	var state string
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT state, failures_in_row FROM webhook_endpoint_health WHERE endpoint_id = $1`, ep).Scan(&state, &failures))
	require.Equal(t, "active", state)
	require.Zero(t, failures)
}

// Past QUILL_WEBHOOK_RETRY_FOR a failing delivery is failed; failing for
// QUILL_WEBHOOK_DISABLE_AFTER disables the endpoint, whose later events
// are not recorded.
func TestGivesUpAndDisables(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{answer: func(int, request) int { return http.StatusInternalServerError }}
	ep, _ := h.endpoint(newServer(t, rc).URL, created)
	m, _ := h.start(dispatch.Config{BackoffMin: 20 * time.Millisecond, BackoffMax: 40 * time.Millisecond,
		RetryFor: 300 * time.Millisecond, DisableAfter: time.Hour})
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	r := h.waitState(ep, id, "failed")
	require.GreaterOrEqual(t, r.Attempts, 2)
	require.Equal(t, 500, *r.LastStatus)
	require.Equal(t, "HTTP 500", *r.LastError)
	require.Eventually(t, func() bool { return counter(m.Deliveries.WithLabelValues("failed")) >= 1 }, waitLong, 10*time.Millisecond)
	for _, got := range rc.ids() {
		require.Equal(t, id, got)
	}
}

func TestDisablesAfterFailingLongEnough(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{answer: func(int, request) int { return http.StatusBadGateway }}
	ep, _ := h.endpoint(newServer(t, rc).URL, created)
	h.start(dispatch.Config{BackoffMin: 20 * time.Millisecond, BackoffMax: 40 * time.Millisecond, DisableAfter: 300 * time.Millisecond})
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	r := h.waitState(ep, id, "failed")
	require.Contains(t, *r.LastError, "endpoint disabled: failing since")
	var state, reason string
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT state, disabled_reason FROM webhook_endpoint_health WHERE endpoint_id = $1`, ep).Scan(&state, &reason))
	require.Equal(t, "disabled", state)
	require.Contains(t, reason, "QUILL_WEBHOOK_DISABLE_AFTER")
	// A later event is not recorded for the disabled endpoint.
	later, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	time.Sleep(500 * time.Millisecond)
	_, ok := h.delivery(ep, later)
	require.False(t, ok)
}

// A 410 Gone disables the endpoint at once and fails the delivery.
func TestGoneDisablesAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{answer: func(int, request) int { return http.StatusGone }}
	ep, _ := h.endpoint(newServer(t, rc).URL, created)
	h.endpoint(newServer(t, &receiver{}).URL, created)
	m, _ := h.start(dispatch.Config{MaintenanceInterval: 50 * time.Millisecond})
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	r := h.waitState(ep, id, "failed")
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, 410, *r.LastStatus)
	require.Eventually(t, func() bool {
		return gauge(m.Endpoints.WithLabelValues("disabled")) == 1 && gauge(m.Endpoints.WithLabelValues("active")) == 1
	}, waitLong, 20*time.Millisecond, "quill_webhook_endpoints counts one disabled, one active")
	var state, reason string
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT state, disabled_reason FROM webhook_endpoint_health WHERE endpoint_id = $1`, ep).Scan(&state, &reason))
	require.Equal(t, "disabled", state)
	require.Contains(t, reason, "410")
}

// A note's events reach an endpoint in version order, even when the first
// needs retries.
func TestVersionOrderPerEndpoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{answer: func(n int, _ request) int {
		if n == 1 {
			return http.StatusServiceUnavailable // the first version fails once
		}
		return http.StatusOK
	}}
	ep, _ := h.endpoint(newServer(t, rc).URL, created, updated)
	h.start(dispatch.Config{BackoffMin: 200 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	note := uuid.New()
	var ids []string
	id, _ := h.publish(contract.EventNoteCreated, note, 1)
	ids = append(ids, id)
	for v := int64(2); v <= 4; v++ {
		id, _ := h.publish(contract.EventNoteUpdated, note, v)
		ids = append(ids, id)
	}
	h.waitState(ep, ids[3], "delivered")
	require.Equal(t, append([]string{ids[0]}, ids...), rc.ids(), "sent in version order, the first twice")
}

// One endpoint that hangs never delays another's deliveries.
func TestSlowEndpointDelaysNoOther(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	release := make(chan struct{})
	var hung atomic.Int32
	slow := &receiver{answer: func(int, request) int { hung.Add(1); <-release; return http.StatusOK }}
	fast := &receiver{}
	a, _ := h.endpoint(newServer(t, slow).URL, created)
	b, _ := h.endpoint(newServer(t, fast).URL, created)
	h.start(dispatch.Config{Timeout: 20 * time.Second, EndpointConcurrency: 2, Concurrency: 4})
	t.Cleanup(func() { close(release) }) // before the dispatcher's stop, which waits for the POSTs
	var ids []string
	for range 10 {
		id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
		ids = append(ids, id)
	}
	start := time.Now()
	for _, id := range ids {
		h.waitState(b, id, "delivered")
	}
	require.Less(t, time.Since(start), 5*time.Second, "B's deliveries waited for A")
	require.Equal(t, int32(2), hung.Load(), "A has its 2 POSTs in flight, no more")
	_, ok := h.delivery(a, ids[9])
	require.True(t, ok)
}

// histogramCount is the sample count of the histogram name on reg.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// counter is c's value.
func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// gauge reads g's value.
func gauge(g prometheus.Gauge) float64 {
	var d dto.Metric
	_ = g.Write(&d)
	return d.GetGauge().GetValue()
}

// dtoGauge reads the pending gauge.
type dtoGauge struct{}

func (dtoGauge) read(m *dispatch.Metrics) float64 {
	var d dto.Metric
	_ = m.Pending.Write(&d)
	return d.GetGauge().GetValue()
}
