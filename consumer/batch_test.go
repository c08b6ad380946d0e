package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
)

// batchConfig is a group-commit test consumer's configuration: room for a
// whole burst in one batch, and a window wide enough on a loaded machine.
func (b *bundle) batchConfig() consumer.Config {
	cfg := b.config()
	cfg.Concurrency, cfg.MaxBatch, cfg.MaxBatchWait = 32, 32, 50*time.Millisecond
	return cfg
}

// startBatch is start for NewBatch.
func (b *bundle) startBatch(cfg consumer.Config, h consumer.BatchHandler) (*consumer.Consumer, func() error) {
	b.t.Helper()
	c, err := consumer.NewBatch(b.pool, b.js, cfg, h)
	require.NoError(b.t, err)
	return c, b.run(c)
}

// seen is a batch handler's log of the events it was given, by call.
type seen struct {
	mu    sync.Mutex
	calls [][]string
}

func (s *seen) add(events []consumer.Event) {
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	s.mu.Lock()
	s.calls = append(s.calls, ids)
	s.mu.Unlock()
}

// times returns how often each event id was given to the handler.
func (s *seen) times() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := map[string]int{}
	for _, c := range s.calls {
		for _, id := range c {
			n[id]++
		}
	}
	return n
}

// recordAll writes one effect row per event, with the transaction's id.
func recordAll(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
	for _, ev := range events {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (event_id, subject, seq) VALUES ($1, $2, txid_current())`, ev.ID, ev.Subject); err != nil {
			return err
		}
	}
	return nil
}

// batches returns the sample count and sum of quill_consumer_batch_size
// for outcome.
func batches(t *testing.T, reg prometheus.Registerer, outcome string) (count uint64, sum float64) {
	t.Helper()
	mfs, err := reg.(prometheus.Gatherer).Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "quill_consumer_batch_size" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	t.Fatalf("no quill_consumer_batch_size{outcome=%q}", outcome)
	return 0, 0
}

// burst publishes n note.created events and returns their ids.
func (b *bundle) burst(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.created("")
	}
	return ids
}

// A burst of events waiting on the stream is committed in fewer
// transactions than events, each event applied once.
func TestBatchCommitsABurstInFewerTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	const n = 24
	ids := b.burst(n)
	var s seen
	b.startBatch(cfg, func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		s.add(events)
		return recordAll(ctx, tx, events)
	})
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, n)
	b.settled(cfg.Durable)
	for _, id := range ids {
		require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
		require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 1`, id))
	}
	txs := b.count(`SELECT count(DISTINCT seq) FROM effects`)
	require.Less(t, txs, n, "one transaction per event")
	count, sum := batches(t, cfg.Registerer, "committed")
	require.Equal(t, uint64(txs), count, "batch size samples")
	require.Equal(t, float64(n), sum)
	require.Zero(t, metric(t, cfg.Registerer, consumer.ResultDuplicate))
	require.Zero(t, metric(t, cfg.Registerer, consumer.ResultFailed))
	fellBack, _ := batches(t, cfg.Registerer, "fell_back")
	require.Zero(t, fellBack)
}

// An event the inbox holds already, and a second copy of an event in the
// same burst, are acknowledged and left out of the handler's events.
func TestBatchLeavesDuplicatesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	var s seen
	h := func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		s.add(events)
		return recordAll(ctx, tx, events)
	}
	_, stop := b.startBatch(cfg, h)
	noteA := uuid.NewString()
	a := b.created(noteA)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	require.NoError(t, stop())

	// Republished beyond the duplicate window: new Nats-Msg-Ids.
	subject := "quill." + b.tenant + ".note.created"
	b.publish(subject, a+":again", b.event(a, noteA, "quill.note.created.v1"))
	noteB := uuid.NewString()
	bID := b.created(noteB)
	b.publish(subject, bID+":again", b.event(bID, noteB, "quill.note.created.v1"))
	others := b.burst(5)

	cfg.Registerer = prometheus.NewRegistry()
	b.startBatch(cfg, h)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 6)
	waitMetric(t, cfg.Registerer, consumer.ResultDuplicate, 2)
	b.settled(cfg.Durable)
	times := s.times()
	for _, id := range append([]string{a, bID}, others...) {
		require.Equal(t, 1, times[id], "event %s given to the handler", id)
		require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
	}
	count, sum := batches(t, cfg.Registerer, "committed")
	require.Less(t, count, uint64(8), "the burst was not batched")
	require.Equal(t, float64(8), sum)
	for _, c := range s.calls {
		require.NotEmpty(t, c, "the handler was called with no events")
	}
}

// One event whose handler fails rolls its batch back; its neighbours
// commit alone on their first delivery, and it follows the per-event
// rules to its dead letter.
func TestBatchFailingEventDoesNotFailItsNeighbours(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	cfg.MaxDeliver, cfg.Retries = 2, -1
	bad := uuid.NewString()
	// Waiting on the stream before the consumer starts: fetched together.
	good := b.burst(4)
	b.publish("quill."+b.tenant+".note.created", bad, b.event(bad, uuid.NewString(), "quill.note.created.v1"))
	good = append(good, b.burst(4)...)
	var s seen
	b.startBatch(cfg, func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		s.add(events)
		// The writes of the whole batch roll back with the failure.
		if err := recordAll(ctx, tx, events); err != nil {
			return err
		}
		for _, ev := range events {
			if ev.ID == bad {
				return errors.New("boom")
			}
		}
		return nil
	})
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, float64(len(good)))
	b.settled(cfg.Durable)
	for _, id := range good {
		require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
		require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 1`, id),
			"event %s not committed on its first delivery", id)
	}
	require.Equal(t, 0, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, bad))
	dl := b.deadLetters()
	require.Len(t, dl, 1)
	require.Equal(t, bad, dl[0].EventID)
	require.Equal(t, "delivery 2 of at most 2: handler: boom", dl[0].Reason)
	fellBack, _ := batches(t, cfg.Registerer, "fell_back")
	require.Positive(t, fellBack)
	// The bad event was tried in its batch, then alone on each delivery.
	require.Equal(t, 3, s.times()[bad])
}

// A batch that outlasts BatchTimeout rolls back, and its events commit
// one by one within their own handler timeout.
func TestBatchPastItsDeadlineFallsBackToOneByOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	cfg.BatchTimeout = 200 * time.Millisecond
	var batched atomic.Int32
	ids := b.burst(6)
	b.startBatch(cfg, func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		if len(events) > 1 {
			batched.Add(1)
			<-ctx.Done() // a lock waited for
			return ctx.Err()
		}
		return recordAll(ctx, tx, events)
	})
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, float64(len(ids)))
	b.settled(cfg.Durable)
	require.Positive(t, batched.Load())
	for _, id := range ids {
		require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 1`, id))
		require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
	}
	require.Zero(t, metric(t, cfg.Registerer, consumer.ResultFailed))
}

// A crash after a batch's commit and before its acknowledgements: every
// message is redelivered and found in the inbox.
func TestBatchRedeliveryAfterCommitIsADuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	cfg.Retries = -1
	var s seen
	c, _ := b.startBatch(cfg, func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		s.add(events)
		return recordAll(ctx, tx, events)
	})
	consumer.SetAfterCommit(c, func(ev consumer.Event) error {
		if ev.Delivery.Deliveries == 1 {
			return errors.New("crash before the ack")
		}
		return nil
	})
	ids := b.burst(8)
	waitMetric(t, cfg.Registerer, consumer.ResultDuplicate, float64(len(ids)))
	b.settled(cfg.Durable)
	require.Equal(t, float64(len(ids)), metric(t, cfg.Registerer, consumer.ResultProcessed))
	times := s.times()
	for _, id := range ids {
		require.Equal(t, 1, times[id], "event %s handled again", id)
		require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
		require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 1`, id))
	}
	count, sum := batches(t, cfg.Registerer, "committed")
	require.Less(t, count, uint64(len(ids)), "the burst was not batched")
	require.Equal(t, float64(len(ids)), sum, "first deliveries in batches")
}

// A shutdown that outlasts ShutdownTimeout while a batch runs rolls it
// back at once — not at the end of its long BatchTimeout — and Naks its
// messages; the next consumer applies each once.
func TestBatchShutdownMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	cfg.ShutdownTimeout = 100 * time.Millisecond
	cfg.HandlerTimeout, cfg.BatchTimeout = 2*waitLong, waitLong
	ids := b.burst(6)
	started := make(chan struct{})
	var once sync.Once
	_, stop := b.startBatch(cfg, func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		if err := recordAll(ctx, tx, events); err != nil {
			return err
		}
		once.Do(func() { close(started) })
		<-ctx.Done()
		return ctx.Err()
	})
	<-started
	begun := time.Now()
	require.NoError(t, stop())
	require.Less(t, time.Since(begun), 3*time.Second, "the shutdown waited for the batch's own deadline")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM effects`))
	require.Equal(t, 0, b.count(`SELECT count(*) FROM quill_consumer_inbox`))

	cfg.Registerer = prometheus.NewRegistry()
	b.startBatch(cfg, recordAll)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, float64(len(ids)))
	b.settled(cfg.Durable)
	for _, id := range ids {
		require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, id))
	}
	require.Empty(t, b.deadLetters())
}

// A handler panic in a batch is the batch's failure: the neighbours commit
// alone, no member waits for ever, and the panicking event's in-process
// retries run alone.
func TestBatchHandlerPanicFallsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	cfg.MaxDeliver = 1
	bad := uuid.NewString()
	good := b.burst(3)
	b.publish("quill."+b.tenant+".note.created", bad, b.event(bad, uuid.NewString(), "quill.note.created.v1"))
	good = append(good, b.burst(3)...)
	var calls atomic.Int32
	b.startBatch(cfg, func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		if slices.ContainsFunc(events, func(ev consumer.Event) bool { return ev.ID == bad }) {
			calls.Add(1)
			panic("nil map")
		}
		return recordAll(ctx, tx, events)
	})
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, float64(len(good)))
	b.settled(cfg.Durable)
	require.Equal(t, "delivery 1 of at most 1: handler panicked: nil map", b.deadLetters()[0].Reason)
	require.Equal(t, len(good), b.count(`SELECT count(*) FROM effects`))
	for _, id := range good {
		require.Equal(t, 1, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1 AND deliveries = 1`, id))
	}
	fellBack, _ := batches(t, cfg.Registerer, "fell_back")
	require.Positive(t, fellBack)
	// Once in its batch, then alone: the first attempt and the two
	// in-process retries, which do not join a batch again.
	require.Equal(t, int32(1+1+cfg.WithDefaults().Retries), calls.Load())
}

func TestNewBatchRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := consumer.NewBatch(b.pool, b.js, consumer.Config{Durable: "x"}, nil)
	require.ErrorContains(t, err, "no handler")
	_, err = consumer.NewBatch(b.pool, b.js, consumer.Config{Durable: "x", MaxBatch: -1}, recordAll)
	require.ErrorContains(t, err, "Config.MaxBatch")
}
