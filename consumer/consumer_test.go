package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
)

func TestEventsAreProcessedOnceAndAcknowledged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	b.start(cfg, record)
	ids := []string{b.created(""), b.created(""), b.created("")}
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 3)
	b.settled(cfg.Durable)
	for _, id := range ids {
		require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
		require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE consumer = 'projection' AND event_id = $1 AND deliveries = 1`, id))
	}
	require.Zero(t, metric(t, cfg.Registerer, consumer.ResultDuplicate))
	require.Zero(t, metric(t, cfg.Registerer, consumer.ResultFailed))
	mfs, err := cfg.Registerer.(prometheus.Gatherer).Gather()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
		require.Equal(t, "projection", mf.GetMetric()[0].GetLabel()[0].GetValue(), "%s: consumer label", mf.GetName())
		if mf.GetName() == "quill_consumer_handler_duration_seconds" {
			require.Equal(t, uint64(3), mf.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
	require.Equal(t, map[string]bool{"quill_consumer_messages_total": true, "quill_consumer_handler_duration_seconds": true,
		"quill_consumer_handlers_running": true, "quill_consumer_acks_total": true, "quill_consumer_pending_messages": true,
		"quill_consumer_dead_letters": true}, seen)
}

// A republish beyond the duplicate window (another Nats-Msg-Id, the same
// event) is a duplicate: nothing but the acknowledgement.
func TestRepublishedEventIsADuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	var calls atomic.Int32
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		calls.Add(1)
		return record(ctx, tx, ev)
	})
	note := uuid.NewString()
	id := b.created(note)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	b.publish("quill."+b.tenant+".note.created", id+":again", b.event(id, note, "quill.note.created.v1"))
	waitMetric(t, cfg.Registerer, consumer.ResultDuplicate, 1)
	b.settled(cfg.Durable)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects`))
}

// A crash between the commit and the acknowledgement: the message is
// redelivered, found in the inbox, and acknowledged without a second effect.
func TestRedeliveryAfterCommitIsADuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Retries = -1 // the failure goes back to the server: a real redelivery
	var calls atomic.Int32
	c, _ := b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		calls.Add(1)
		return record(ctx, tx, ev)
	})
	consumer.SetAfterCommit(c, func(ev consumer.Event) error {
		if ev.Delivery.Deliveries == 1 {
			return errors.New("crash before the ack")
		}
		return nil
	})
	id := b.created("")
	waitMetric(t, cfg.Registerer, consumer.ResultDuplicate, 1)
	b.settled(cfg.Durable)
	require.Equal(t, int32(1), calls.Load(), "the handler ran again")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 1`, id))
	require.Equal(t, float64(1), metric(t, cfg.Registerer, consumer.ResultProcessed))
}

func TestFailingHandlerIsRetriedThenSucceeds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		retries int
		// wantDeliveries is the delivery that succeeds.
		wantDeliveries int
		wantFailed     float64
	}{
		{"redelivered", -1, 3, 2},
		{"in process", 2, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := b.config()
			cfg.Retries = tc.retries
			var calls atomic.Int32
			b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
				// Its write is rolled back with the failure.
				if err := record(ctx, tx, ev); err != nil {
					return err
				}
				if calls.Add(1) < 3 {
					return errors.New("database briefly away")
				}
				return nil
			})
			id := b.created("")
			waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
			b.settled(cfg.Durable)
			require.Equal(t, int32(3), calls.Load())
			require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
			require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = $2`, id, tc.wantDeliveries))
			require.Equal(t, tc.wantFailed, metric(t, cfg.Registerer, consumer.ResultFailed))
			require.Empty(t, b.deadLetters())
		})
	}
}

func TestEventFailingMaxDeliverTimesIsADeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.MaxDeliver, cfg.Retries = 3, -1
	bad := uuid.NewString()
	var calls atomic.Int32
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if ev.ID == bad {
			calls.Add(1)
			return errors.New("boom")
		}
		return record(ctx, tx, ev)
	})
	note := uuid.NewString()
	payload := b.event(bad, note, "quill.note.created.v1")
	seq := b.publish("quill."+b.tenant+".note.created", bad, payload)
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	good := b.created("")
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	b.settled(cfg.Durable)
	require.Equal(t, int32(3), calls.Load())
	require.Equal(t, []deadLetter{{EventID: bad, Subject: "quill.acme.note.created", Reason: "delivery 3 of at most 3: handler: boom",
		Seq: int64(seq), Deliveries: 3, Payload: payload}}, b.deadLetters())
	require.Equal(t, 0, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1`, bad))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, good))
	require.Equal(t, float64(2), metric(t, cfg.Registerer, consumer.ResultFailed))
}

// A message delivered more often than MaxDeliver — its handling killed the
// process every time, so it never failed — is a dead letter before its
// handler runs again.
func TestEventDeliveredPastMaxDeliverIsNotHandledAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.MaxDeliver = 2
	c, err := consumer.New(b.pool, b.js, cfg, record)
	require.NoError(t, err)
	cons, err := c.Provision(t.Context())
	require.NoError(t, err)
	id := b.created("")
	// Two deliveries that never came back: as if the process died.
	for range 2 {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			require.NoError(t, m.Nak())
		}
		require.NoError(t, batch.Error())
	}
	var calls atomic.Int32
	cfg.Registerer = prometheus.NewRegistry()
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		calls.Add(1)
		return record(ctx, tx, ev)
	})
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	b.settled(cfg.Durable)
	dl := b.deadLetters()
	require.Len(t, dl, 1)
	require.Equal(t, id, dl[0].EventID)
	require.Equal(t, "delivered 3 times, the limit is 2 (not handled again)", dl[0].Reason)
	require.Equal(t, 3, dl[0].Deliveries)
	require.Zero(t, calls.Load())
	require.Equal(t, 0, b.count(`SELECT count(*) FROM effects`))
}

func TestMessageThatIsNotAQuillEventIsADeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Validate = func(ev consumer.Event) error {
		if ev.Type == "quill.note.deleted.v1" {
			return errors.New("data: missing deleted_at")
		}
		return nil
	}
	var calls atomic.Int32
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		calls.Add(1)
		return record(ctx, tx, ev)
	})
	note := uuid.NewString()
	id := uuid.NewString()
	subject := "quill." + b.tenant + ".note.created"
	cases := []struct {
		subject string
		payload []byte
		reason  string
	}{
		{subject, []byte("not json"), "unparseable event: "},
		{subject, []byte(`{"specversion":"1.0"}`), "event has no id"},
		{subject, []byte(`{"specversion":"1.0","id":"x","source":"/tenants/acme","type":"quill.note.created.v1","subject":"n","time":"2026-12-01T10:00:00Z","data":{}}`),
			`event id "x" is not a UUID`},
		{subject, []byte(`{"specversion":"1.0","id":"` + id + `","type":"quill.note.created.v1","subject":"n","time":"2026-12-01T10:00:00Z","data":{}}`),
			"event has no source"},
		{"quill.other.note.created", b.event(id, note, "quill.note.created.v1"),
			`event of tenant "acme" and type "quill.note.created.v1" delivered on subject "quill.other.note.created"`},
		{"quill." + b.tenant + ".note.deleted", b.event(uuid.NewString(), note, "quill.note.deleted.v1"),
			"invalid event: data: missing deleted_at"},
	}
	for i, tc := range cases {
		b.publish(tc.subject, "garbage-"+string(rune('a'+i)), tc.payload)
	}
	good := b.created(note)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, float64(len(cases)))
	b.settled(cfg.Durable)
	dl := b.deadLetters()
	require.Len(t, dl, len(cases))
	for i, tc := range cases {
		require.Contains(t, dl[i].Reason, tc.reason, "case %d", i)
		require.Equal(t, tc.payload, dl[i].Payload)
		require.Equal(t, tc.subject, dl[i].Subject)
		require.Equal(t, 1, dl[i].Deliveries)
	}
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, good))
}

func TestHandlerPanicIsRetriedAndDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.MaxDeliver = 2
	b.start(cfg, func(context.Context, pgx.Tx, consumer.Event) error { panic("nil map") })
	b.created("")
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	dl := b.deadLetters()
	require.Len(t, dl, 1)
	require.Equal(t, "delivery 2 of at most 2: handler panicked: nil map", dl[0].Reason)
}

func TestPermanentErrorIsADeadLetterAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	var calls atomic.Int32
	b.start(cfg, func(context.Context, pgx.Tx, consumer.Event) error {
		calls.Add(1)
		return consumer.Permanent(errors.New("note refers to an unknown folder"))
	})
	b.created("")
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, "delivery 1: permanent: handler: note refers to an unknown folder", b.deadLetters()[0].Reason)
}

// A shutdown that outlasts ShutdownTimeout cancels the handler: its
// transaction rolls back, the message is Nak'ed, and the next consumer
// processes it once.
func TestShutdownMidHandlerLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.ShutdownTimeout = 100 * time.Millisecond
	started := make(chan struct{})
	var once sync.Once
	_, stop := b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		once.Do(func() { close(started) })
		<-ctx.Done()
		return ctx.Err()
	})
	id := b.created("")
	<-started
	require.NoError(t, stop())
	require.Equal(t, 0, b.count(`SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(`SELECT count(*) FROM quill_consumer_inbox`))

	cfg.Registerer = prometheus.NewRegistry()
	b.start(cfg, record)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	b.settled(cfg.Durable)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 2`, id))
	require.Empty(t, b.deadLetters())
}

// A handler that finishes within ShutdownTimeout commits and is
// acknowledged before Run returns.
func TestShutdownLetsARunningHandlerFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.ShutdownTimeout = waitLong
	started, release := make(chan struct{}), make(chan struct{})
	_, stop := b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		close(started)
		<-release
		return record(ctx, tx, ev)
	})
	id := b.created("")
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Run waits for the handler.
	select {
	case err := <-stopped:
		t.Fatalf("Run returned before the handler finished: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	require.Equal(t, float64(1), metric(t, cfg.Registerer, consumer.ResultProcessed))
	b.settled(cfg.Durable) // acknowledged, not left for a redelivery
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
}

func TestPoolNeverRunsMoreThanConcurrencyHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Concurrency = 3
	var running, most atomic.Int32
	gate := make(chan struct{})
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return record(ctx, tx, ev)
	})
	for range 10 {
		b.created("")
	}
	require.Eventually(t, func() bool { return running.Load() == 3 }, waitLong, tick)
	// One durable consumer, and no more delivered to the process than it
	// can run: the other seven wait on the server.
	cons, err := b.js.Consumer(t.Context(), b.stream, cfg.Durable)
	require.NoError(t, err)
	info, err := cons.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, info.NumAckPending)
	require.Equal(t, uint64(7), info.NumPending)
	close(gate)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 10)
	b.settled(cfg.Durable)
	require.Equal(t, int32(3), most.Load())
	require.Equal(t, 10, b.count(`SELECT count(*) FROM effects`))
}

func TestOrderBySubjectRunsOneNotesEventsOneAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Concurrency = 4
	cfg.OrderBySubject = true
	var mu sync.Mutex
	runningOf := map[string]int{}
	var overlaps, concurrent int
	var total int
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		mu.Lock()
		runningOf[ev.Subject]++
		total++
		if runningOf[ev.Subject] > 1 {
			overlaps++
		}
		if total > 1 {
			concurrent++
		}
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // the effect's work
		mu.Lock()
		runningOf[ev.Subject]--
		total--
		mu.Unlock()
		return record(ctx, tx, ev)
	})
	notes := []string{uuid.NewString(), uuid.NewString()}
	for i := range 16 {
		b.created(notes[i%2])
	}
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 16)
	b.settled(cfg.Durable)
	require.Zero(t, overlaps, "two events of one note ran at once")
	require.Positive(t, concurrent, "the two notes never ran at once: the pool was not used")
	// Each note's events committed in stream order.
	for _, n := range notes {
		rows, err := b.pool.Query(t.Context(), `SELECT seq FROM effects WHERE subject = $1 ORDER BY n`, n)
		require.NoError(t, err)
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Len(t, seqs, 8)
		require.IsIncreasing(t, seqs)
	}
}

// A handler that runs longer than the ack wait keeps its message: the
// consumer reports it in progress, so the server does not redeliver it.
func TestLongHandlerIsReportedInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.AckWait = time.Second
	var calls atomic.Int32
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if calls.Add(1) == 1 {
			time.Sleep(2500 * time.Millisecond) // two and a half ack waits of work
		}
		return record(ctx, tx, ev)
	})
	id := b.created("")
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	b.settled(cfg.Durable)
	require.Equal(t, int32(1), calls.Load(), "redelivered while its handler ran")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 1`, id))
	require.Zero(t, metric(t, cfg.Registerer, consumer.ResultDuplicate))
}

// Started before the stream exists, the consumer waits for it and says why
// it is not ready.
func TestConsumerWaitsForTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Stream, cfg.FilterSubjects = "LATER", []string{"later.>"}
	c, _ := b.start(cfg, record)
	require.Eventually(t, func() bool {
		err := c.Ready(t.Context())
		return err != nil && strings.Contains(err.Error(), "stream LATER not found")
	}, waitLong, tick)
	_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "LATER", Subjects: []string{"later.>"}})
	require.NoError(t, err)
	id := uuid.NewString()
	b.publish("later."+b.tenant+".note.created", id, b.event(id, uuid.NewString(), "quill.note.created.v1"))
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	require.NoError(t, c.Ready(t.Context()))
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	_, err := consumer.New(b.pool, b.js, cfg, record)
	require.NoError(t, err)
	_, err = consumer.New(b.pool, b.js, cfg, record)
	require.ErrorContains(t, err, `metrics of consumer "projection" are registered already`)
	_, err = consumer.New(b.pool, b.js, consumer.Config{Durable: "x"}, nil)
	require.ErrorContains(t, err, "no handler")
	_, err = consumer.New(b.pool, b.js, consumer.Config{}, record)
	require.ErrorContains(t, err, "Config.Durable is required")
}

// Two processes share the durable consumer, and every event arrives twice
// (republished beyond the duplicate window), often to both at once: the
// inbox row's lock makes one of each pair wait for the other and find it.
func TestTwoProcessesApplyEachEventOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg1, cfg2 := b.config(), b.config()
	b.start(cfg1, record)
	b.start(cfg2, record)
	for range 20 {
		note := uuid.NewString()
		id := b.created(note)
		b.publish("quill."+b.tenant+".note.created", id+":again", b.event(id, note, "quill.note.created.v1"))
	}
	require.Eventually(t, func() bool {
		return metric(t, cfg1.Registerer, consumer.ResultProcessed)+metric(t, cfg2.Registerer, consumer.ResultProcessed) == 20 &&
			metric(t, cfg1.Registerer, consumer.ResultDuplicate)+metric(t, cfg2.Registerer, consumer.ResultDuplicate) == 20
	}, waitLong, tick)
	b.settled(cfg1.Durable)
	require.Equal(t, 20, b.count(`SELECT count(*) FROM effects`))
	require.Equal(t, 20, b.count(`SELECT count(DISTINCT event_id) FROM effects`))
}
