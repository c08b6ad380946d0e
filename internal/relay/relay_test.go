package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/eventschema"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// waitLong bounds every wait for the relay to catch up; the polls end as
// soon as the condition holds.
const waitLong = 30 * time.Second

// harness is one test's world: a fresh schema, its own in-process NATS
// server, and a stream, subject prefix and tenant named uniquely — advisory
// locks and LISTEN/NOTIFY channels are per database, which parallel tests
// share.
type harness struct {
	t      *testing.T
	url    string
	pool   *pgxpool.Pool // the test's own connections: writes and checks
	srv    *natstest.Server
	js     jetstream.JetStream // an observer's connection
	suffix string
	stream string
	prefix string
	tenant string
}

func newHarness(t *testing.T, opts ...natstest.Option) *harness {
	t.Helper()
	pool, u := dbtest.Pool(t, 8)
	srv := natstest.Start(t, opts...)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	return &harness{t: t, url: u, pool: pool, srv: srv, js: js, suffix: suffix,
		stream: "RELAY_" + strings.ToUpper(suffix), prefix: "q" + suffix, tenant: "acme-" + suffix}
}

// config is a relay configuration with short horizons that still nest.
func (h *harness) config() relay.Config {
	return relay.Config{
		Stream:       stream.Config{Name: h.stream, SubjectPrefix: h.prefix, DuplicateWindow: time.Minute, MaxAge: time.Hour},
		Lease:        time.Second,
		PollInterval: 100 * time.Millisecond,
		MaxBackoff:   250 * time.Millisecond,
		AckTimeout:   time.Second,
		Batch:        64,
	}
}

// newRelay returns a relay named id with its own pool — whose sessions carry
// application_name = id, so a test can find its backends — and its own NATS
// connection, and the relay's metrics.
func (h *harness) newRelay(cfg relay.Config, id string, opts ...relay.Option) (*relay.Relay, *metrics.Relay) {
	h.t.Helper()
	return h.newRelayLogging(cfg, id, testkit.Logger(h.t), opts...)
}

func (h *harness) newRelayLogging(cfg relay.Config, id string, log zerolog.Logger, opts ...relay.Option) (*relay.Relay, *metrics.Relay) {
	t := h.t
	t.Helper()
	pool, err := db.Open(context.Background(), dbtest.WithParam(t, h.url, "application_name", id), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	nc, _ := h.srv.Connect(t, relay.ConnOptions()...)
	m := metrics.NewRelay(prometheus.NewRegistry())
	r, err := relay.New(pool, nc, cfg, log, m, append([]relay.Option{relay.WithID(id)}, opts...)...)
	require.NoError(t, err)
	return r, m
}

// notifyingNotes is the API's notes service over the test's pool, and the
// notifier that wakes the relays at each of its commits (and at each
// Signal) until ctx ends or the test ends.
func (h *harness) notifyingNotes(ctx context.Context) (*notes.Service, *outbox.Notifier) {
	t := h.t
	t.Helper()
	notifier := outbox.NewNotifier(h.pool, nil)
	nctx, stopNotifier := context.WithCancel(ctx)
	t.Cleanup(stopNotifier)
	go func() { _ = notifier.Run(nctx) }()
	svc, err := notes.NewService(h.pool, notes.Config{}, testkit.Logger(t), notes.WithNotifier(notifier))
	require.NoError(t, err)
	return svc, notifier
}

func (h *harness) relayID(name string) string { return "relay-" + h.suffix + "-" + name }

// start runs r until stop is called or the test ends; stop returns what Run
// returned. Registered after the relay's pool and connection, it runs first
// at cleanup.
func start(t *testing.T, r *relay.Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(waitLong):
				err = errors.New("Run did not return after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("relay run: %v", err)
		}
	})
	return stop
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	h.t.Cleanup(cancel)
	return ctx
}

func (h *harness) event(tenant string, note uuid.UUID, typ string, data any) outbox.Event {
	if data == nil {
		data = eventData(note, typ)
	}
	return outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: tenant, AggregateID: note, Type: typ,
		Time: time.Now(), Data: data}
}

// eventData returns data of type typ about note, of the types the API and
// the worker write, so that what the relay publishes is held to its
// schema (streamMessages).
func eventData(note uuid.UUID, typ string) any {
	now := notes.FormatTime(time.Now())
	switch typ {
	case contract.EventNoteCreated:
		return notes.NoteView{ID: note.String(), Title: "note", CreatedAt: now, Version: 1, UpdatedAt: now}
	case contract.EventNoteDeleted:
		return notes.DeleteResult{ID: note.String(), DeletedAt: now}
	default:
		return processedData(note, "")
	}
}

// processedData is an attachment.processed event's data about note that
// gave up for reason (any, when empty).
func processedData(note uuid.UUID, reason string) worker.ProcessedData {
	if reason == "" {
		reason = "corrupt: png: invalid format"
	}
	return worker.ProcessedData{NoteID: note.String(), AttachmentID: uuid.NewSHA1(note, []byte("attachment")).String(),
		State: worker.StateFailed, Reason: reason}
}

// streamMessages returns the messages of stream, in stream order, each
// checked against its event type's schema and SPEC §5's envelope: a
// payload that drifts from its published schema fails the relay's tests.
func streamMessages(t *testing.T, js jetstream.JetStream, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	msgs := natstest.StreamMessages(t, js, stream, "")
	for _, m := range msgs {
		require.NoError(t, eventschema.Validate(m.Data), "message %d", m.Sequence)
	}
	return msgs
}

// write commits one event in its own transaction and, like the API after a
// commit, notifies the relays. It returns the event id.
func (h *harness) write(tenant string, note uuid.UUID, typ string) uuid.UUID {
	h.t.Helper()
	return h.writeEvent(h.event(tenant, note, typ, nil))
}

func (h *harness) writeEvent(e outbox.Event) uuid.UUID {
	h.t.Helper()
	ctx := h.ctx()
	require.NoError(h.t, db.WithTx(ctx, h.pool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }))
	h.notify()
	return e.ID
}

func (h *harness) notify() {
	h.t.Helper()
	_, err := h.pool.Exec(h.ctx(), `SELECT pg_notify($1, '')`, outbox.NotifyChannel)
	require.NoError(h.t, err)
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.pool.QueryRow(h.ctx(), sql, args...).Scan(&n))
	return n
}

func (h *harness) published() int {
	return h.count(`SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL`)
}

// waitPublished polls until n events are marked published.
func (h *harness) waitPublished(n int) {
	h.t.Helper()
	testkit.WaitFor(h.t, waitLong, func() bool { return h.published() >= n }, fmt.Sprintf("%d events published", n))
	require.Equal(h.t, n, h.published())
}

type outboxRow struct {
	Seq          int64
	ID           uuid.UUID
	Aggregate    uuid.UUID
	Type         string
	Published    bool
	StreamSeq    int64
	Attempts     int
	ClaimedBy    string
	Parked       bool
	ParkedReason string
	AckDuplicate bool
}

// rows returns the outbox in seq order.
func (h *harness) rows() []outboxRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT seq, id, aggregate_id, type, published_at IS NOT NULL,
		coalesce(stream_seq, 0), attempts, coalesce(claimed_by, ''), parked_at IS NOT NULL, coalesce(parked_reason, ''),
		ack_duplicate FROM outbox_events ORDER BY seq`)
	require.NoError(h.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	require.NoError(h.t, err)
	return out
}

func (h *harness) row(id uuid.UUID) outboxRow {
	h.t.Helper()
	for _, r := range h.rows() {
		if r.ID == id {
			return r
		}
	}
	require.FailNow(h.t, "no outbox row", "event %s", id)
	return outboxRow{}
}

// cloudEvent is the part of a message's CloudEvents body the tests read.
type cloudEvent struct {
	ID      string `json:"id"`
	Source  string `json:"source"`
	Type    string `json:"type"`
	Subject string `json:"subject"`
}

// requireExactlyOnce checks that the outbox holds want events, all marked
// published, and that the stream holds each exactly once — no Nats-Msg-Id
// twice, nothing else — at the stream sequence the outbox recorded, on the
// event's subject, as CloudEvents whose id is the Nats-Msg-Id. It returns
// the stream's messages in stream order.
func (h *harness) requireExactlyOnce(want int) []*jetstream.RawStreamMsg {
	t := h.t
	t.Helper()
	rows := h.rows()
	require.Len(t, rows, want, "events in the outbox")
	msgs := streamMessages(t, h.js, h.stream)
	seqOf := make(map[string]uint64, len(msgs))
	for _, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		_, twice := seqOf[id]
		require.False(t, twice, "event %s is in the stream twice", id)
		seqOf[id] = m.Sequence
		var ce cloudEvent
		require.NoError(t, json.Unmarshal(m.Data, &ce), "message %d", m.Sequence)
		require.Equal(t, id, ce.ID, "Nats-Msg-Id is the CloudEvents id")
		require.Equal(t, "application/cloudevents+json", m.Header.Get("Content-Type"))
	}
	require.Len(t, msgs, want, "messages in the stream")
	for _, r := range rows {
		require.True(t, r.Published, "event %s (seq %d) is marked published", r.ID, r.Seq)
		seq, ok := seqOf[r.ID.String()]
		require.True(t, ok, "event %s (seq %d) is in the stream", r.ID, r.Seq)
		require.Equal(t, int64(seq), r.StreamSeq, "the outbox records the stream sequence of event %s", r.ID)
	}
	for _, m := range msgs {
		require.True(t, strings.HasPrefix(m.Subject, h.prefix+"."), "subject %s", m.Subject)
	}
	return msgs
}

// requireCommitOrderPerNote checks that, for every note (the CloudEvents
// subject), the stream holds its events in outbox seq order — the order of
// their commits when one writer commits them one after another.
func (h *harness) requireCommitOrderPerNote(msgs []*jetstream.RawStreamMsg) map[string][]string {
	t := h.t
	t.Helper()
	want := map[string][]string{}
	for _, r := range h.rows() {
		want[r.Aggregate.String()] = append(want[r.Aggregate.String()], r.ID.String())
	}
	got := map[string][]string{}
	types := map[string][]string{}
	for _, m := range msgs {
		var ce cloudEvent
		require.NoError(t, json.Unmarshal(m.Data, &ce))
		got[ce.Subject] = append(got[ce.Subject], ce.ID)
		types[ce.Subject] = append(types[ce.Subject], ce.Type)
	}
	require.Equal(t, len(want), len(got), "notes in the stream")
	for note, ids := range want {
		require.Equal(t, ids, got[note], "events of note %s in the stream, in commit order", note)
	}
	return types
}

func TestConfigValidateRefusesHorizonsThatDoNotNest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  relay.Config
		want []string // substrings of the error; nil: valid
	}{
		{name: "defaults nest", cfg: relay.Config{}},
		{name: "short test horizons nest", cfg: relay.Config{Stream: stream.Config{DuplicateWindow: time.Minute, MaxAge: time.Hour},
			Lease: 300 * time.Millisecond, PollInterval: 100 * time.Millisecond, MaxBackoff: 250 * time.Millisecond, AckTimeout: time.Second}},
		{name: "lease longer than the duplicate window", cfg: relay.Config{Lease: 15 * time.Minute},
			want: []string{"QUILL_DUPLICATE_WINDOW 10m0s", "lease 15m0s", "backoff cap 30s", "poll interval 1s", "ack timeout 10s"}},
		{name: "lease, backoff, poll and ack timeout together reach the window",
			// 10s + 30s + 30s + 1s = 71s: equal is refused, shorter than the window is required.
			cfg:  relay.Config{Stream: stream.Config{DuplicateWindow: 71 * time.Second}},
			want: []string{"= 1m11s", "QUILL_DUPLICATE_WINDOW 1m11s"}},
		{name: "one more second and they fit", cfg: relay.Config{Stream: stream.Config{DuplicateWindow: 72 * time.Second}}},
		{name: "backoff alone breaks a short window", cfg: relay.Config{Stream: stream.Config{DuplicateWindow: time.Minute}, MaxBackoff: time.Minute, Lease: time.Second},
			want: []string{"backoff cap 1m0s", "QUILL_DUPLICATE_WINDOW 1m0s"}},
		{name: "duplicate window longer than the stream keeps messages", cfg: relay.Config{Stream: stream.Config{DuplicateWindow: 2 * time.Hour, MaxAge: time.Hour}},
			want: []string{"QUILL_DUPLICATE_WINDOW 2h0m0s", "QUILL_STREAM_MAX_AGE 1h0m0s"}},
		{name: "duplicate window equal to MaxAge", cfg: relay.Config{Stream: stream.Config{DuplicateWindow: time.Hour, MaxAge: time.Hour}}},
		{name: "negative batch", cfg: relay.Config{Batch: -1}, want: []string{"batch must be at least 1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg.WithDefaults()
			err := cfg.Validate()
			if tc.want == nil {
				require.NoError(t, err)
				require.Less(t, cfg.WorstRepublishDelay(), cfg.Stream.DuplicateWindow)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			// New refuses the same configurations before touching NATS.
			_, newErr := relay.New(nil, nil, tc.cfg, zerolog.Nop(), nil)
			require.EqualError(t, newErr, err.Error())
		})
	}
}

// TestNATSOutageLosesAndDuplicatesNothing stops NATS while 100 events are
// written and restarts it on the same store: every event reaches the
// stream once — the republishes the outage caused are dropped by the
// duplicate window — and the outbox records each one's stream sequence.
func TestNATSOutageLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.AckTimeout = 500 * time.Millisecond
	r, m := h.newRelay(cfg, h.relayID("a"))
	require.NoError(t, r.Provision(h.ctx()))
	start(t, r)

	h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	h.waitPublished(1)
	require.NoError(t, r.Ready(h.ctx()))

	h.srv.Stop()
	testkit.WaitFor(t, waitLong, func() bool { return r.Ready(h.ctx()) != nil }, "the relay to notice NATS is down")
	// 100 events of 20 notes, five each, interleaved.
	noteIDs := make([]uuid.UUID, 20)
	for i := range noteIDs {
		noteIDs[i] = uuid.New()
	}
	for i := range 100 {
		typ := contract.EventAttachmentProcessed
		switch i / 20 {
		case 0:
			typ = contract.EventNoteCreated
		case 4:
			typ = contract.EventNoteDeleted
		}
		h.write(h.tenant, noteIDs[i%20], typ)
	}
	// Only each note's oldest event may be in flight: the relay tries the
	// 20 first events, and fails, until NATS is back.
	testkit.WaitFor(t, waitLong, func() bool {
		return h.count(`SELECT count(DISTINCT aggregate_id) FROM outbox_events
			WHERE published_at IS NULL AND attempts > 0 AND last_error IS NOT NULL`) == 20
	}, "the relay to try every note's first event during the outage, and fail")
	require.Equal(t, 1, h.published(), "nothing is marked published while NATS is down")
	require.Equal(t, 20, h.count(`SELECT count(*) FROM outbox_events WHERE attempts > 0 AND published_at IS NULL`),
		"a note's later events wait behind its first")
	require.GreaterOrEqual(t, testkit.Value(m.Errors), 20.0)

	h.srv.Restart(t)
	h.waitPublished(101)
	msgs := h.requireExactlyOnce(101)
	h.requireCommitOrderPerNote(msgs)
	require.NoError(t, r.Ready(h.ctx()))
	t.Logf("publish errors %v, duplicates %v, acks %v", testkit.Value(m.Errors),
		testkit.Value(m.Duplicates), testkit.Value(m.Published))
}

// TestCrashBetweenAckAndMarkRepublishesAsDuplicate kills a pass after the
// stream acknowledged its events and before they were marked: their claims
// end, the next pass publishes them again, JetStream reports duplicates, the
// outbox records each ack as a duplicate, and the stream holds one message
// per event.
func TestCrashBetweenAckAndMarkRepublishesAsDuplicate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Lease = 300 * time.Millisecond
	require.NoError(t, cfg.WithDefaults().Validate())

	var (
		crashed      atomic.Bool
		crashedAcks  atomic.Int64
		retakeAcks   atomic.Int64
		unmarkedSeen atomic.Int64 // published events in the outbox when the retake was acked
	)
	hooks := relay.Hooks{AfterAck: func(acked []outbox.Published) error {
		if len(acked) == 0 {
			return nil
		}
		if crashed.CompareAndSwap(false, true) {
			crashedAcks.Store(int64(len(acked)))
			return errors.New("injected crash between the ack and the mark")
		}
		if retakeAcks.Load() == 0 {
			retakeAcks.Store(int64(len(acked)))
			var n int64
			if err := h.pool.QueryRow(context.Background(),
				`SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL`).Scan(&n); err != nil {
				n = -1
			}
			unmarkedSeen.Store(n)
		}
		return nil
	}}
	r, m := h.newRelay(cfg, h.relayID("crashy"), relay.WithHooks(hooks))
	require.NoError(t, r.Provision(h.ctx()))
	for range 5 {
		h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	}
	start(t, r)

	h.waitPublished(5)
	require.True(t, crashed.Load())
	require.EqualValues(t, 5, crashedAcks.Load(), "the crashed pass had all five acknowledged")
	require.EqualValues(t, 5, retakeAcks.Load(), "the next pass published all five again")
	require.Zero(t, unmarkedSeen.Load(), "nothing was marked by the crashed pass")
	require.GreaterOrEqual(t, testkit.Value(m.Duplicates), 5.0, "JetStream reported the republished events as duplicates")
	require.GreaterOrEqual(t, testkit.Value(m.Published), 10.0)
	h.requireExactlyOnce(5)
	for _, row := range h.rows() {
		// The crashed attempt left no trace (a crash cannot record one);
		// the attempt that marked it is counted.
		require.Equal(t, 1, row.Attempts, "event %s", row.ID)
		require.True(t, row.AckDuplicate, "event %s: the republish was acknowledged as a duplicate, and recorded", row.ID)
	}
}

// TestDeadRelaysClaimsPassToAnother: relay a publishes a batch and hangs
// before marking it, holding its claims; relay b, running meanwhile, leaves
// those events alone. When a's sessions end — as when its process dies — b
// takes the events over and republishes them: JetStream reports duplicates,
// b records them as such, and the stream holds each event once.
func TestDeadRelaysClaimsPassToAnother(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	hung := make(chan struct{})
	unhang := make(chan struct{})
	var hangOnce sync.Once
	idA := h.relayID("dying")
	a, _ := h.newRelay(cfg, idA, relay.WithHooks(relay.Hooks{AfterAck: func(acked []outbox.Published) error {
		if len(acked) == 0 {
			return nil
		}
		hangOnce.Do(func() { close(hung) })
		<-unhang
		return errors.New("the relay died before its mark")
	}}))
	require.NoError(t, a.Provision(h.ctx()))
	for range 5 {
		h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	}
	start(t, a)
	t.Cleanup(func() { close(unhang) }) // runs before a is stopped
	select {
	case <-hung:
	case <-time.After(waitLong):
		require.FailNow(t, "relay a did not publish its batch")
	}

	b, mb := h.newRelay(cfg, h.relayID("b"))
	start(t, b)
	h.notify()
	require.Never(t, func() bool { return testkit.Value(mb.Published) > 0 || h.published() > 0 }, 10*cfg.PollInterval, cfg.PollInterval/4,
		"relay b publishes nothing while a holds the events")

	killed := h.count(`SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()) t`, idA)
	require.Positive(t, killed)
	h.waitPublished(5)
	h.requireExactlyOnce(5)
	require.GreaterOrEqual(t, testkit.Value(mb.Duplicates), 5.0)
	for _, row := range h.rows() {
		require.Equal(t, h.relayID("b"), row.ClaimedBy, "event %s", row.ID)
		require.True(t, row.AckDuplicate, "event %s", row.ID)
	}
}

// TestShutdownFinishesTheBatchInFlight ends the relay's context after the
// stream acknowledged a batch: the pass still marks it, and Run returns nil.
func TestShutdownFinishesTheBatchInFlight(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var acked atomic.Int64
	r, _ := h.newRelay(h.config(), h.relayID("stopping"), relay.WithHooks(relay.Hooks{AfterAck: func(a []outbox.Published) error {
		if len(a) > 0 {
			acked.Add(int64(len(a)))
			cancel() // SIGTERM arrives while the batch is in flight
		}
		return nil
	}}))
	require.NoError(t, r.Provision(h.ctx()))
	for range 5 {
		h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testkit.RequireReturned(t, done, waitLong, "a graceful stop returns nil")
	require.EqualValues(t, 5, acked.Load())
	require.Equal(t, 5, h.published(), "the batch in flight was marked before Run returned")
	h.requireExactlyOnce(5)
}

// TestTwoRelaysPublishEveryEventOnceInCommitOrderPerNote runs two relays
// over 2,000 events of 200 notes: four writers each take notes through their
// life — the API creates the note, four updates through the API and four
// processing events are committed in turn, the API deletes it — so creates and deletes of different notes interleave
// and each note's events commit one after another. Half the notes are
// written before the relays start (a backlog in which a note's events sit
// side by side, as after an outage), half while they run. Every event is in
// the stream exactly once and, per note, in commit order.
func TestTwoRelaysPublishEveryEventOnceInCommitOrderPerNote(t *testing.T) {
	t.Parallel()
	const (
		noteCount    = 200
		extraPerNote = 8
		perNote      = extraPerNote + 2
		writers      = 4
		total        = noteCount * perNote
	)
	h := newHarness(t)
	cfg := h.config()
	cfg.Batch = 16
	cfg.Lease = 5 * time.Second // a slow pass under -race must not lose its claim
	a, ma := h.newRelay(cfg, h.relayID("a"))
	b, mb := h.newRelay(cfg, h.relayID("b"))
	require.NoError(t, a.Provision(h.ctx()))
	require.NoError(t, b.Provision(h.ctx()), "a second relay's provisioning updates the stream in place")

	ctx := h.ctx()
	svc, notifier := h.notifyingNotes(ctx)

	life := func(ctx context.Context, n int) error {
		out, err := svc.Create(ctx, notes.Request{Tenant: h.tenant, Key: fmt.Sprintf("create-%d", n), Wait: -1, Render: httpapi.RenderWrite},
			notes.CreateParams{Title: fmt.Sprintf("note %d", n)})
		if err != nil {
			return err
		}
		id, err := uuid.Parse(strings.TrimPrefix(out.Resource, "/v1/notes/"))
		if err != nil {
			return fmt.Errorf("create %d: resource %q: %w", n, out.Resource, err)
		}
		version := 1
		for step := range extraPerNote {
			if step%2 == 0 {
				// Every other event is an update through the API, each
				// against the version the previous one made.
				title := fmt.Sprintf("note %d v%d", n, version+1)
				out, err := svc.Update(ctx, notes.Request{Tenant: h.tenant, Key: fmt.Sprintf("update-%d-%d", n, step), Wait: -1,
					IfMatch: version, Render: httpapi.RenderWrite}, id, notes.UpdateParams{Title: &title})
				if err != nil {
					return err
				}
				if out.Outcome != notes.OutcomeUpdated {
					return fmt.Errorf("update %d: outcome %s: %s", n, out.Outcome, out.Body)
				}
				version++
				continue
			}
			e := h.event(h.tenant, id, contract.EventAttachmentProcessed, processedData(id, fmt.Sprintf("step %d", step)))
			if err := db.WithTx(ctx, h.pool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }); err != nil {
				return err
			}
			notifier.Signal()
		}
		out, err = svc.Delete(ctx, notes.Request{Tenant: h.tenant, Key: fmt.Sprintf("delete-%d", n), Wait: -1,
			IfMatch: version, Render: httpapi.RenderWrite}, id)
		if err != nil {
			return err
		}
		if out.Outcome != notes.OutcomeDeleted {
			return fmt.Errorf("delete %d: outcome %s: %s", n, out.Outcome, out.Body)
		}
		return nil
	}
	// write takes notes [from, to) through their lives, four at a time.
	write := func(from, to int) error {
		g, gctx := errgroup.WithContext(ctx)
		for w := range writers {
			g.Go(func() error {
				for n := from + w; n < to; n += writers {
					if err := life(gctx, n); err != nil {
						return err
					}
				}
				return nil
			})
		}
		return g.Wait()
	}

	require.NoError(t, write(0, noteCount/2))
	start(t, a)
	start(t, b)
	require.NoError(t, write(noteCount/2, noteCount))

	h.waitPublished(total)
	msgs := h.requireExactlyOnce(total)
	types := h.requireCommitOrderPerNote(msgs)
	require.Len(t, types, noteCount)
	for note, ts := range types {
		require.Len(t, ts, perNote, "note %s", note)
		require.Equal(t, "quill.note.created.v1", ts[0], "note %s", note)
		require.Equal(t, "quill.note.deleted.v1", ts[perNote-1], "note %s", note)
	}
	// Per note, the stream holds its versions in order: created 1, the
	// updates 2.., the delete last + 1 — version order is publish order.
	versions := map[string][]int{}
	for _, m := range msgs {
		var ce struct {
			Subject string `json:"subject"`
			Data    struct {
				Version *int `json:"version"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(m.Data, &ce))
		if ce.Data.Version != nil {
			versions[ce.Subject] = append(versions[ce.Subject], *ce.Data.Version)
		}
	}
	want := make([]int, extraPerNote/2+2)
	for i := range want {
		want[i] = i + 1
	}
	for note, vs := range versions {
		require.Equal(t, want, vs, "versions of note %s in stream order", note)
	}
	require.Len(t, versions, noteCount)
	by := map[string]int{}
	for _, r := range h.rows() {
		by[r.ClaimedBy]++
	}
	t.Logf("published by %v; duplicates a=%v b=%v", by, testkit.Value(ma.Duplicates), testkit.Value(mb.Duplicates))
	require.Len(t, by, 2, "both relays took part")
}

// TestLateCommitIsPublished holds a transaction with an event open while
// later events commit and are published; once it commits, its event — the
// lowest seq of all — is published too: there is no "seq > last seen"
// cursor to skip it.
func TestLateCommitIsPublished(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r, _ := h.newRelay(h.config(), h.relayID("a"))
	require.NoError(t, r.Provision(h.ctx()))
	start(t, r)

	ctx := h.ctx()
	tx, err := h.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	held := h.event(h.tenant, uuid.New(), contract.EventNoteCreated, nil)
	require.NoError(t, outbox.Insert(ctx, tx, held))

	var later []uuid.UUID
	for range 10 {
		later = append(later, h.write(h.tenant, uuid.New(), contract.EventNoteCreated))
	}
	h.waitPublished(10)

	require.NoError(t, tx.Commit(ctx))
	h.notify()
	h.waitPublished(11)
	msgs := h.requireExactlyOnce(11)

	heldRow := h.row(held.ID)
	for _, id := range later {
		lr := h.row(id)
		require.Less(t, heldRow.Seq, lr.Seq, "the held event was written first")
		require.Greater(t, heldRow.StreamSeq, lr.StreamSeq, "and reached the stream last")
	}
	require.Equal(t, held.ID.String(), msgs[len(msgs)-1].Header.Get(jetstream.MsgIDHeader))
}

// TestParkedEventDoesNotBlockOthers makes one event unpublishable — its
// payload is over the server's max_payload — and checks that it is parked
// with its reason, that other notes' events, earlier and later, are
// published, and that only its own note's later events wait behind it.
// Retrying it unchanged parks it again without blocking anything. (The
// operator's retry after fixing the cause, through the command line, is in
// cmd/relay.)
func TestParkedEventDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, natstest.WithMaxPayload(4096))
	r, m := h.newRelay(h.config(), h.relayID("a"))
	require.NoError(t, r.Provision(h.ctx()))

	noteA, noteB, noteC := uuid.New(), uuid.New(), uuid.New()
	before := h.write(h.tenant, noteB, contract.EventNoteCreated)
	big := h.writeEvent(h.event(h.tenant, noteA, contract.EventNoteCreated,
		notes.NoteView{ID: noteA.String(), Title: "big", Body: strings.Repeat("x", 8192), CreatedAt: notes.FormatTime(time.Now()), Version: 1, UpdatedAt: notes.FormatTime(time.Now())}))
	behind := h.write(h.tenant, noteA, contract.EventNoteDeleted)
	after := h.write(h.tenant, noteC, contract.EventNoteCreated)
	start(t, r)

	testkit.WaitFor(t, waitLong, func() bool { return h.row(big).Parked }, "the oversized event to be parked")
	h.waitPublished(2)
	parked := h.row(big)
	require.False(t, parked.Published)
	require.Contains(t, parked.ParkedReason, "max_payload of 4096")
	require.True(t, h.row(before).Published)
	require.True(t, h.row(after).Published, "a later event of another note is published")
	require.GreaterOrEqual(t, testkit.Value(m.Errors), 1.0)
	// The backlog gauges read the outbox (every statsInterval): the parked
	// event counts as parked and as pending, with the event behind it.
	testkit.RequireMetric(t, waitLong, m.Parked, 1)
	testkit.RequireMetric(t, waitLong, m.Pending, 2) // the parked event and the one behind it

	// Events written after the park flow too, and the parked event's own
	// note waits behind it (its order must hold).
	later := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	testkit.WaitFor(t, waitLong, func() bool { return h.row(later).Published }, "a new event to be published")
	b := h.row(behind)
	require.False(t, b.Published, "the parked event's note keeps its order")
	require.False(t, b.Parked)
	require.Zero(t, b.Attempts, "it was never claimed")

	list, err := outbox.ListParked(h.ctx(), h.pool)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, big, list[0].ID)
	require.Equal(t, noteA, list[0].NoteID)
	require.Equal(t, parked.ParkedReason, list[0].Reason)

	// Retried with its cause unfixed, it is parked again; nothing else stops.
	// (A second Unpark here would race the running relay, which may have
	// claimed and parked it again already; outbox's own tests hold that
	// unparking a queued event is ErrNotParked.)
	require.NoError(t, outbox.Unpark(h.ctx(), h.pool, big))
	h.notify()
	testkit.WaitFor(t, waitLong, func() bool { r := h.row(big); return r.Parked && r.Attempts == 2 }, "the retried event to be parked again")
	last := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	testkit.WaitFor(t, waitLong, func() bool { return h.row(last).Published }, "a new event to be published")
	require.Equal(t, 4, h.published())
	require.Len(t, streamMessages(t, h.js, h.stream), 4)
}

// TestPostgresConnectionLossRecovers terminates the relay's PostgreSQL
// sessions — its pool's and its LISTEN connection — repeatedly while events
// are written: the relay reconnects by itself, LISTENs again, and publishes
// every event exactly once.
func TestPostgresConnectionLossRecovers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.relayID("pgloss")
	var logs clitest.SyncBuffer
	r, m := h.newRelayLogging(h.config(), id, zerolog.New(&logs))
	require.NoError(t, r.Provision(h.ctx()))
	start(t, r)

	listener := func() int {
		var pid int
		err := h.pool.QueryRow(h.ctx(), `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN%'`, id).Scan(&pid)
		require.NoError(t, err)
		return pid
	}
	terminate := func() int {
		return h.count(`SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = $1 AND pid <> pg_backend_pid()) t`, id)
	}

	written := 0
	writeSome := func(n int) {
		for range n {
			h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
			written++
		}
	}
	writeSome(5)
	h.waitPublished(written)
	testkit.WaitFor(t, waitLong, func() bool { return listener() != 0 }, "the relay's LISTEN session")
	oldListener := listener()

	for round := range 3 {
		killed := terminate()
		if round == 0 {
			require.GreaterOrEqual(t, killed, 2, "the relay's pool and LISTEN sessions were terminated")
		}
		writeSome(5) // written while the relay reconnects
	}
	h.waitPublished(written)
	testkit.WaitFor(t, waitLong, func() bool { l := listener(); return l != 0 && l != oldListener },
		"the relay to LISTEN again on a new session")
	require.NoError(t, r.Ready(h.ctx()))

	writeSome(5)
	h.waitPublished(written)
	h.requireExactlyOnce(written)
	require.Contains(t, logs.String(), `"error_category":"listen_failed"`, "the relay saw its LISTEN session end")
	t.Logf("publish errors %v, duplicates %v; warnings:\n%s", testkit.Value(m.Errors), testkit.Value(m.Duplicates), logs.String())
}

// After a cause that parked many events is fixed, one command returns them
// all to the queue and they are published.
func TestUnparkAllPublishesEveryParkedEvent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r, _ := h.newRelay(h.config(), h.relayID("a"))
	require.NoError(t, r.Provision(h.ctx()))
	var ids []uuid.UUID
	for range 3 {
		ids = append(ids, h.write(h.tenant, uuid.New(), contract.EventNoteCreated))
	}
	var seqs []int64
	require.NoError(t, pgx.BeginFunc(h.ctx(), h.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(h.ctx(), `SELECT seq FROM outbox_events ORDER BY seq`)
		if err != nil {
			return err
		}
		seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	}))
	for _, seq := range seqs {
		require.NoError(t, outbox.Park(h.ctx(), h.pool, seq, "test: parked by hand"))
	}
	parked, err := outbox.ListParked(h.ctx(), h.pool)
	require.NoError(t, err)
	require.Len(t, parked, 3)
	n, err := r.Pass(h.ctx())
	require.NoError(t, err)
	require.Zero(t, n, "parked events are not claimed")

	unparked, err := outbox.UnparkAll(h.ctx(), h.pool)
	require.NoError(t, err)
	require.EqualValues(t, 3, unparked)
	_, err = r.Pass(h.ctx())
	require.NoError(t, err)
	msgs := h.requireExactlyOnce(3)
	require.Len(t, msgs, len(ids))
}

// After a pass that published something, the relay claims again at once: a
// note's later events, held back while its earlier one was in flight, are
// claimable now and nothing else would wake the relay for them. The test runs
// in a database of its own, because NOTIFY is per database and other tests'
// notifications would wake this relay and hide the difference; the poll
// interval is far longer than the wait.
func TestHeldBackEventsFollowWithoutWaitingForThePoll(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	base, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	name := "quill_relay_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	admin := *base
	base.Path = "/" + name
	_, err = dbtest.Migrate(ctx, base.String()) // creates the database
	require.NoError(t, err)
	t.Cleanup(func() {
		admin.Path = "/postgres"
		conn, err := pgx.Connect(context.Background(), admin.String())
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	pool, err := db.Open(ctx, base.String(), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	srv := natstest.Start(t)
	nc, js := srv.Connect(t, relay.ConnOptions()...)
	suffix := testkit.UniqueSuffix()
	cfg := relay.Config{Stream: stream.Config{Name: "HELD_" + strings.ToUpper(suffix), SubjectPrefix: "q" + suffix,
		DuplicateWindow: 2 * time.Minute, MaxAge: time.Hour}, Lease: time.Second, AckTimeout: time.Second,
		MaxBackoff: 250 * time.Millisecond, PollInterval: time.Minute, Batch: 64}
	note := uuid.New()
	const events = 5
	for range events {
		e := outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: "acme-" + suffix, AggregateID: note,
			Type: contract.EventAttachmentProcessed, Time: time.Now(), Data: processedData(note, "")}
		require.NoError(t, db.WithTx(ctx, pool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }))
	}
	r, err := relay.New(pool, nc, cfg, testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()))
	require.NoError(t, err)
	require.NoError(t, r.Provision(ctx))
	start(t, r)
	// One event per pass (one note); the relay's own start-up wake gives at
	// most one extra pass, so five events in well under the poll interval
	// need the immediate re-claim.
	testkit.WaitFor(t, 10*time.Second, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL`).Scan(&n)
		return n == events
	}, "all of the note's events published before the next poll")
	require.Len(t, streamMessages(t, js, cfg.Stream.Name), events)
}
