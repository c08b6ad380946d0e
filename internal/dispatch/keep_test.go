package dispatch_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/dispatch"
	"github.com/quillhq/quill/internal/whsecret"
)

// With the SSRF rules on, a delivery to a loopback address is refused
// before any connection, counted refused, its reason recorded, and retried.
func TestRefusedDeliveryIsRecorded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	port, accepted := listener(t, "tcp4", "127.0.0.1:0")
	ep, _ := h.endpoint("https://127.0.0.1:"+port+"/hook", created)
	plain, _ := h.endpoint("http://example.com/hook", created)
	m, _ := h.startWith(dispatch.Config{BackoffMin: time.Hour, BackoffMax: time.Hour}, false)
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	var r, rp row
	require.Eventually(t, func() bool {
		var ok, okp bool
		r, ok = h.delivery(ep, id)
		rp, okp = h.delivery(plain, id)
		return ok && okp && r.Attempts == 1 && r.LastError != nil && rp.LastError != nil
	}, waitLong, 20*time.Millisecond)
	require.Equal(t, "pending", r.State, "retried later")
	require.Contains(t, *r.LastError, "loopback")
	require.Nil(t, r.LastStatus)
	require.Contains(t, *rp.LastError, "only https")
	require.Eventually(t, func() bool { return counter(m.Deliveries.WithLabelValues(dispatch.ResultRefused)) == 2 }, waitLong, 10*time.Millisecond)
	require.Zero(t, accepted())
}

// Maintenance counts the backlog database-wide, fails the pending
// deliveries of deleted endpoints, and deletes settled rows past the
// retention.
func TestMaintenance(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{answer: func(int, request) int { return 503 }}
	ep, _ := h.endpoint(newServer(t, rc).URL, created)
	m, _ := h.start(dispatch.Config{BackoffMin: time.Hour, BackoffMax: time.Hour, Retention: time.Hour, MaintenanceInterval: 100 * time.Millisecond})
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	require.Eventually(t, func() bool { r, ok := h.delivery(ep, id); return ok && r.Attempts == 1 && r.LastStatus != nil }, waitLong, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		var d dtoGauge
		return d.read(m) == 1
	}, waitLong, 20*time.Millisecond, "quill_webhook_pending counts the pending delivery")

	// A settled row older than the retention goes; a newer one stays.
	other, _ := h.endpoint(newServer(t, &receiver{}).URL, updated)
	for i, age := range []string{"2 hours", "1 minute"} {
		_, err := h.pool.Exec(t.Context(), `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, delivered_at)
			VALUES ($1, $2, $3, 'quill.note.updated.v1', '{}', now(), 'delivered', now() - $4::interval)`, h.tenant, other, uuid.New(), age)
		require.NoError(t, err, i)
	}
	require.Eventually(t, func() bool {
		var n int
		_ = h.pool.QueryRow(t.Context(), `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1`, other).Scan(&n)
		return n == 1
	}, waitLong, 20*time.Millisecond)

	// The endpoint deleted: its pending delivery fails, out of the backlog.
	_, err := h.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET deleted_at = now() WHERE id = $1`, ep)
	require.NoError(t, err)
	r := h.waitState(ep, id, "failed")
	require.Equal(t, "endpoint deleted", *r.LastError)
	require.Eventually(t, func() bool { var d dtoGauge; return d.read(m) == 0 }, waitLong, 20*time.Millisecond)
	require.Eventually(t, func() bool { return gauge(m.Endpoints.WithLabelValues("active")) == 1 }, waitLong, 20*time.Millisecond,
		"a deleted endpoint is not counted")
}

// A claim that takes more of one endpoint's deliveries than it may send
// at once queues up to four times its concurrency (claimed ahead) and gives
// the rest back: with a concurrency of 1 per endpoint and a hanging
// receiver, one POST is in flight, four rows are queued under their lease,
// and every other row is unleased, its attempts and first attempt undone.
func TestOverClaimedRowsAreGivenBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	release := make(chan struct{})
	rc := &receiver{answer: func(int, request) int { <-release; return 200 }}
	ep, _ := h.endpoint(newServer(t, rc).URL, created)
	// The rows exist before the dispatcher starts: its first claim takes
	// eight (Concurrency) of the ten.
	for range 10 {
		_, err := h.pool.Exec(t.Context(), `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time)
			VALUES ($1, $2, $3, $4, '{}', now())`, h.tenant, ep, uuid.New(), created)
		require.NoError(t, err)
	}
	h.start(dispatch.Config{Timeout: 20 * time.Second, EndpointConcurrency: 1, Concurrency: 8, BackoffMin: time.Hour, BackoffMax: time.Hour})
	t.Cleanup(func() { close(release) }) // before the dispatcher's stop, which waits for the POST
	require.Eventually(t, func() bool { return len(rc.requests()) == 1 }, waitLong, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	var leased, attempted, started int
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE lease_until > now()), count(*) FILTER (WHERE attempts > 0),
		count(*) FILTER (WHERE first_attempt_at IS NOT NULL) FROM webhook_deliveries WHERE endpoint_id = $1`, ep).Scan(&leased, &attempted, &started))
	require.Equal(t, 5, leased)
	require.Equal(t, 5, attempted)
	require.Equal(t, 5, started)
	require.Len(t, rc.requests(), 1)
}

// A receiver slower than QUILL_WEBHOOK_TIMEOUT: the attempt's outcome is
// unknown, recorded as a timeout, and the POST is sent again under the same
// webhook-id.
func TestTimeoutIsRetriedUnderTheSameID(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{answer: func(n int, _ request) int {
		if n == 1 {
			time.Sleep(600 * time.Millisecond)
		}
		return 200
	}}
	ep, _ := h.endpoint(newServer(t, rc).URL, created)
	h.start(dispatch.Config{Timeout: 200 * time.Millisecond, BackoffMin: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	r := h.waitState(ep, id, "delivered")
	require.Equal(t, 2, r.Attempts)
	require.Equal(t, []string{id, id}, rc.ids())
	var health string
	require.NoError(t, h.pool.QueryRow(t.Context(), `SELECT last_status::text FROM webhook_endpoint_health WHERE endpoint_id = $1`, ep).Scan(&health))
	require.Equal(t, "200", health)
}

// During a rotation both secrets sign: each verifies.
func TestBothSecretsSignDuringARotation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rc := &receiver{}
	ep, current := h.endpoint(newServer(t, rc).URL, created)
	previous, err := whsecret.NewSecret()
	require.NoError(t, err)
	sealed, err := h.keys.Seal(previous, h.tenant, ep.String())
	require.NoError(t, err)
	_, err = h.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET previous_secret_sealed = $2, previous_secret_until = now() + interval '1 day' WHERE id = $1`, ep, sealed)
	require.NoError(t, err)
	h.start(dispatch.Config{})
	id, _ := h.publish(contract.EventNoteCreated, uuid.New(), 1)
	h.waitState(ep, id, "delivered")
	got := rc.requests()[0]
	require.Len(t, strings.Fields(got.Signature), 2)
	verify(t, current, got)
	verify(t, previous, got)
}
