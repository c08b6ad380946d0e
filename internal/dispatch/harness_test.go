package dispatch_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/dispatch"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/whsecret"
)

const waitLong = 30 * time.Second

// harness is a test's world: a fresh schema, its own NATS server with a
// stream of a unique name and prefix, sealing keys, and a tenant.
type harness struct {
	t      *testing.T
	pool   *pgxpool.Pool
	nc     *nats.Conn
	js     jetstream.JetStream
	keys   *whsecret.Keys
	stream string
	prefix string
	tenant string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	pool, _ := dbtest.Pool(t, 16)
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	keys, err := whsecret.ParseKeys(base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32))))
	require.NoError(t, err)
	h := &harness{t: t, pool: pool, nc: nc, js: js, keys: keys, stream: "WH_" + strings.ToUpper(suffix), prefix: "q" + suffix, tenant: "acme-" + suffix}
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: h.stream, Subjects: []string{contract.AllSubjects(h.prefix)}})
	require.NoError(t, err)
	return h
}

// endpoint inserts an endpoint of the tenant subscribed to types (as the
// API would) and returns its id and secret.
func (h *harness) endpoint(url string, types ...string) (uuid.UUID, string) {
	h.t.Helper()
	id := uuid.New()
	secret, err := whsecret.NewSecret()
	require.NoError(h.t, err)
	sealed, err := h.keys.Seal(secret, h.tenant, id.String())
	require.NoError(h.t, err)
	_, err = h.pool.Exec(h.t.Context(), `INSERT INTO webhook_endpoints (id, tenant, url, event_types, secret_sealed) VALUES ($1, $2, $3, $4, $5)`,
		id, h.tenant, url, types, sealed)
	require.NoError(h.t, err)
	return id, secret
}

// publish publishes a CloudEvent of the tenant and returns its id and bytes.
func (h *harness) publish(event string, note uuid.UUID, version int64) (string, []byte) {
	h.t.Helper()
	id := uuid.NewString()
	data := fmt.Sprintf(`{"id":%q,"version":%d}`, note, version)
	if version == 0 {
		data = fmt.Sprintf(`{"note_id":%q}`, note)
	}
	body := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"/tenants/%s","type":%q,"subject":%q,"time":%q,"datacontenttype":"application/json","data":%s}`,
		id, h.tenant, contract.CloudEventType(event), note, time.Now().UTC().Format(time.RFC3339Nano), data)
	_, err := h.js.Publish(h.t.Context(), contract.Subject(h.prefix, h.tenant, event), []byte(body), jetstream.WithMsgID(id))
	require.NoError(h.t, err)
	return id, []byte(body)
}

// start runs a dispatcher until the test ends and returns its metrics and
// registry.
func (h *harness) start(cfg dispatch.Config) (*dispatch.Metrics, *prometheus.Registry) {
	h.t.Helper()
	return h.startWith(cfg, true)
}

// startWith is start with the SSRF rules on unless allowPrivate.
func (h *harness) startWith(cfg dispatch.Config, allowPrivate bool) (*dispatch.Metrics, *prometheus.Registry) {
	h.t.Helper()
	cfg.AllowPrivate = allowPrivate
	cfg.PollInterval = 100 * time.Millisecond
	if cfg.MaintenanceInterval == 0 {
		cfg.MaintenanceInterval = 200 * time.Millisecond
	}
	reg := prometheus.NewRegistry()
	m := dispatch.NewMetrics(reg)
	d, err := dispatch.New(h.pool, h.nc, consumer.Config{Durable: "webhook-dispatcher", Stream: h.stream,
		FilterSubjects: []string{contract.AllSubjects(h.prefix)}, AckWait: 5 * time.Second, HoldBackDelay: 20 * time.Millisecond},
		cfg, h.keys, zerolog.Nop(), m, reg)
	require.NoError(h.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		require.NoError(h.t, <-done)
	})
	return m, reg
}

// row is a delivery as the table holds it.
type row struct {
	State      string
	Attempts   int
	LastStatus *int
	LastError  *string
}

func (h *harness) delivery(endpoint uuid.UUID, eventID string) (row, bool) {
	var r row
	err := h.pool.QueryRow(h.t.Context(), `SELECT state, attempts, last_status, last_error FROM webhook_deliveries WHERE endpoint_id = $1 AND event_id = $2`,
		endpoint, eventID).Scan(&r.State, &r.Attempts, &r.LastStatus, &r.LastError)
	return r, err == nil
}

// waitState waits until the delivery is in state.
func (h *harness) waitState(endpoint uuid.UUID, eventID, state string) row {
	h.t.Helper()
	var r row
	require.Eventually(h.t, func() bool {
		var ok bool
		r, ok = h.delivery(endpoint, eventID)
		return ok && r.State == state
	}, waitLong, 20*time.Millisecond, "delivery of %s to %s never %s (last %+v)", eventID, endpoint, state, r)
	return r
}

// request is one POST a receiver got.
type request struct {
	ID, Timestamp, Signature, ContentType, UserAgent string
	Body                                             []byte
	At                                               time.Time
}

// receiver records every POST and answers with answer's status.
type receiver struct {
	mu     sync.Mutex
	got    []request
	answer func(n int, r request) int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := request{ID: r.Header.Get("webhook-id"), Timestamp: r.Header.Get("webhook-timestamp"), Signature: r.Header.Get("webhook-signature"),
		ContentType: r.Header.Get("Content-Type"), UserAgent: r.Header.Get("User-Agent"), Body: body, At: time.Now()}
	rc.mu.Lock()
	rc.got = append(rc.got, req)
	n := len(rc.got)
	rc.mu.Unlock()
	status := http.StatusNoContent
	if rc.answer != nil {
		status = rc.answer(n, req)
	}
	w.WriteHeader(status)
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.got...)
}

func (rc *receiver) ids() []string {
	var out []string
	for _, r := range rc.requests() {
		out = append(out, r.ID)
	}
	return out
}

// verify checks r's signature with secret.
func verify(t *testing.T, secret string, r request) {
	t.Helper()
	ts, err := strconv.ParseInt(r.Timestamp, 10, 64)
	require.NoError(t, err)
	require.InDelta(t, time.Now().Unix(), ts, 60)
	ok, err := whsecret.Verify(secret, r.Signature, r.ID, ts, r.Body)
	require.NoError(t, err)
	require.True(t, ok, "signature %q does not verify", r.Signature)
}
