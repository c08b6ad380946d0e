package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/eventschema"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

const waitLong = 30 * time.Second

// harness is one test's world: a fresh schema, its own NATS server, a
// stream, subject prefix and tenant named uniquely, the API's notes service
// and a relay publishing its outbox.
type harness struct {
	t      testing.TB
	url    string
	pool   *pgxpool.Pool
	srv    *natstest.Server
	js     jetstream.JetStream
	svc    *notes.Service
	suffix string
	stream string
	prefix string
	tenant string
	// workers are the workers startWorker started, in order.
	workers []*worker.Worker
	// stopRelay stops the harness's relay.
	stopRelay func()
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	pool, u := dbtest.Pool(t, 8)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	svc, err := notes.NewService(pool, notes.Config{}, zerolog.Nop())
	require.NoError(t, err)
	h := &harness{t: t, url: u, pool: pool, srv: srv, js: js, svc: svc, suffix: suffix,
		stream: "W_" + strings.ToUpper(suffix), prefix: "q" + suffix, tenant: "acme-" + suffix}
	h.validateEventsAtCleanup()
	h.startRelay()
	return h
}

// validateEventsAtCleanup checks, when the test ends (after its relay and
// workers stopped: cleanups run last registered first), every event of the
// test against its type's schema and SPEC §5's envelope: each outbox row —
// the note.created events the API wrote and the attachment.processed events
// the worker wrote — and each stream message the relay published (its
// Nats-Msg-Id names an outbox row; the messages tests forge on purpose do
// not). A payload that drifts from its published schema fails the worker's
// tests.
func (h *harness) validateEventsAtCleanup() {
	t := h.t
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		type event struct {
			ID      string
			Payload []byte
		}
		// Collected before any check: a failed check ends the cleanup,
		// and open rows would hold a connection that the pool's own
		// cleanup then waits for.
		rows, err := h.pool.Query(ctx, `SELECT id::text, payload FROM outbox_events ORDER BY seq`)
		require.NoError(t, err)
		events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[event])
		require.NoError(t, err)
		written := map[string]bool{}
		for _, e := range events {
			written[e.ID] = true
			require.NoError(t, eventschema.Validate(e.Payload), "outbox event %s", e.ID)
		}
		if _, err := h.js.Stream(ctx, h.stream); err != nil {
			// A test that took the stream or the server away; the
			// outbox rows above are the bytes the relay would publish.
			t.Logf("events not read back from the stream: %v", err)
			return
		}
		for _, m := range natstest.StreamMessages(t, h.js, h.stream, "") {
			if id := m.Header.Get(nats.MsgIdHdr); written[id] {
				require.NoError(t, eventschema.Validate(m.Data), "stream message %d (event %s)", m.Sequence, id)
			}
		}
	})
}

func (h *harness) relayConfig() relay.Config {
	return relay.Config{Stream: stream.Config{Name: h.stream, SubjectPrefix: h.prefix, DuplicateWindow: time.Minute, MaxAge: time.Hour},
		Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxBackoff: 250 * time.Millisecond, AckTimeout: time.Second, Batch: 256}
}

func (h *harness) startRelay() {
	t := h.t
	pool, err := db.Open(context.Background(), h.url, 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	nc, _ := h.srv.Connect(t, relay.ConnOptions()...)
	r, err := relay.New(pool, nc, h.relayConfig(), testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()))
	require.NoError(t, err)
	require.NoError(t, r.Provision(t.Context()))
	h.stopRelay = runUntilCleanup(t, r.Run)
}

// config is a worker configuration with short horizons for tests.
func (h *harness) config() worker.Config {
	return worker.Config{Stream: stream.Config{Name: h.stream, SubjectPrefix: h.prefix}, Consumer: consumer.Config{
		Durable: "attachment-worker-" + h.suffix, AckWait: 5 * time.Second, Concurrency: 4, MaxDeliver: 10,
		RetryInterval: 20 * time.Millisecond, NakDelay: 100 * time.Millisecond, MaxNakDelay: 500 * time.Millisecond}}
}

// deadLetters lists consumer's dead letters, the re-driven ones too when
// all is set.
func (h *harness) deadLetters(consumerName string, all bool) ([]consumer.StoredDeadLetter, error) {
	s, err := consumer.NewStore(h.pool, "")
	require.NoError(h.t, err)
	return s.DeadLetters(h.t.Context(), consumer.DeadLetterQuery{Consumer: consumerName, All: all})
}

// redrive republishes dead letter l.
func (h *harness) redrive(l consumer.StoredDeadLetter) (*jetstream.PubAck, error) {
	s, err := consumer.NewStore(h.pool, "")
	require.NoError(h.t, err)
	return s.Redrive(h.t.Context(), h.js, l, time.Now())
}

// startWorker runs a worker with its own pool (on dbURL, default the
// test's) and NATS connection until the test ends; it returns the worker's
// metrics and a stop function.
func (h *harness) startWorker(cfg worker.Config, dbURL string, opts ...worker.Option) (*metrics.Worker, func()) {
	t := h.t
	t.Helper()
	if dbURL == "" {
		dbURL = h.url
	}
	pool, err := db.Open(context.Background(), dbURL, int32(cfg.WithDefaults().Consumer.MaxConcurrentBatches+2))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	nc, _ := h.srv.Connect(t)
	m := metrics.NewWorker(prometheus.NewRegistry())
	w, err := worker.New(pool, nc, cfg, testkit.Logger(t), m, opts...)
	require.NoError(t, err)
	h.workers = append(h.workers, w)
	require.NoError(t, w.Provision(t.Context()))
	stop := runUntilCleanup(t, w.Run)
	return m, stop
}

// runUntilCleanup runs fn until stop is called or the test ends.
func runUntilCleanup(t testing.TB, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run: %v", err)
				}
			case <-time.After(waitLong):
				t.Errorf("Run did not return after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// create creates a note with an attachment through the notes service and
// returns its id.
func (h *harness) create(title, contentType string, data []byte) uuid.UUID {
	h.t.Helper()
	sum := sha256.Sum256(data)
	out, err := h.svc.Create(context.Background(), notes.Request{Tenant: h.tenant, Key: "k-" + uuid.NewString(), Wait: -1, Render: httpapi.RenderWrite},
		notes.CreateParams{Title: title, Attachment: &notes.NewAttachment{Filename: title, ContentType: contentType, Data: data, SHA256: hex.EncodeToString(sum[:])}})
	require.NoError(h.t, err)
	var v struct {
		ID string `json:"id"`
	}
	require.NoError(h.t, json.Unmarshal(out.Body, &v))
	return uuid.MustParse(v.ID)
}

type attRow struct {
	Status    string
	Result    []byte
	Reason    *string
	Thumbnail []byte
}

func (h *harness) attachment(note uuid.UUID) attRow {
	h.t.Helper()
	var r attRow
	require.NoError(h.t, h.pool.QueryRow(context.Background(),
		`SELECT status, result, reason, thumbnail FROM attachments WHERE note_id = $1`, note).Scan(&r.Status, &r.Result, &r.Reason, &r.Thumbnail))
	return r
}

func (h *harness) waitStatus(note uuid.UUID, status string) attRow {
	h.t.Helper()
	testkit.WaitFor(h.t, waitLong, func() bool { return h.attachment(note).Status == status }, "attachment "+status)
	return h.attachment(note)
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// processedEvents counts the attachment.processed events in the outbox for a note.
// republishNoteCreated publishes the stream's one note.created message again
// under a new Nats-Msg-Id, as a relay does after the duplicate window.
func (h *harness) republishNoteCreated() {
	h.t.Helper()
	msgs := natstest.StreamMessages(h.t, h.js, h.stream, h.prefix+".*.note.created")
	require.Len(h.t, msgs, 1)
	re := nats.NewMsg(msgs[0].Subject)
	re.Data = msgs[0].Data
	re.Header.Set(nats.MsgIdHdr, msgs[0].Header.Get(nats.MsgIdHdr)+"-again")
	_, err := h.js.PublishMsg(context.Background(), re)
	require.NoError(h.t, err)
}

func (h *harness) processedEvents(note uuid.UUID) int {
	return h.count(`SELECT count(*) FROM outbox_events WHERE type = 'attachment.processed' AND aggregate_id = $1`, note)
}

var errInjected = errors.New("injected failure")

func title(i int) string { return fmt.Sprintf("note-%04d", i) }
