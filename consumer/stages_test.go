package consumer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
)

// startStaged is start for NewStaged.
func (b *bundle) startStaged(cfg consumer.Config, st consumer.Stages) (*consumer.Consumer, func() error) {
	b.t.Helper()
	c, err := consumer.NewStaged(b.pool, b.js, cfg, st)
	require.NoError(b.t, err)
	return c, b.run(c)
}

// recordItems writes one effect row per item, with the transaction's id.
func recordItems(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
	for _, it := range items {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (event_id, subject, seq) VALUES ($1, $2, txid_current())`, it.Event.ID, it.Event.Subject); err != nil {
			return err
		}
	}
	return nil
}

// gauge returns the value of the unlabelled gauge name on reg.
func gauge(t *testing.T, reg prometheus.Registerer, name string) float64 {
	t.Helper()
	mfs, err := reg.(prometheus.Gatherer).Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// In one batch, Prepare's result reaches Apply; an event Prepare skips
// is acknowledged with no transaction and no inbox row; an event Apply
// fails on its own is left out — its inbox row forgotten — while the rest
// commits in one transaction, and becomes a dead letter (Permanent); a
// result Apply names is counted; Committed sees what committed and was
// skipped.
func TestStagedPerEventOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	ids := b.burst(6)
	skip, refuse, custom := ids[0], ids[1], ids[2]
	var mu sync.Mutex
	var committed []string
	b.startStaged(cfg, consumer.Stages{
		Prepare: func(_ context.Context, items []*consumer.Item) {
			for _, it := range items {
				it.Prepared = "prepared " + it.Event.ID
				it.Skip = it.Event.ID == skip
			}
		},
		Apply: func(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
			var ok []*consumer.Item
			for _, it := range items {
				switch {
				case it.Prepared != "prepared "+it.Event.ID:
					return errors.New("Prepare's result did not reach Apply")
				case it.Event.ID == refuse:
					it.Err = consumer.Permanent(errors.New("refused on its own"))
					continue
				case it.Event.ID == custom:
					it.Result = "custom"
				}
				ok = append(ok, it)
			}
			return recordItems(ctx, tx, ok)
		},
		Committed: func(items []*consumer.Item) {
			mu.Lock()
			defer mu.Unlock()
			for _, it := range items {
				committed = append(committed, it.Event.ID+" "+it.Result)
			}
		},
	})
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 3)
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	b.settled(cfg.Durable)
	require.Equal(t, 1.0, metric(t, cfg.Registerer, consumer.ResultSkipped))
	require.Equal(t, 1.0, metric(t, cfg.Registerer, "custom"))
	require.Equal(t, 4, b.count(`SELECT count(*) FROM effects`))
	require.Equal(t, 1, b.count(`SELECT count(DISTINCT seq) FROM effects`), "one transaction")
	require.Equal(t, 0, b.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = ANY($1::uuid[])`, []string{skip, refuse}))
	require.Equal(t, 4, b.count(`SELECT count(*) FROM quill_consumer_inbox`))
	dl := b.deadLetters()
	require.Len(t, dl, 1)
	require.Equal(t, refuse, dl[0].EventID)
	require.Contains(t, dl[0].Reason, "refused on its own")
	mu.Lock()
	defer mu.Unlock()
	require.ElementsMatch(t, []string{skip + " skipped", custom + " custom", ids[3] + " processed", ids[4] + " processed",
		ids[5] + " processed"}, committed)
}

// An item Prepare puts off (Later) leaves its batch, which commits
// without it; it is then handled alone — Prepare called again for it
// alone — and commits once its preparation ends.
func TestStagedLaterLeavesTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	ids := b.burst(4)
	slow := ids[3]
	release := make(chan struct{})
	var alone atomic.Int32
	b.startStaged(cfg, consumer.Stages{
		Prepare: func(ctx context.Context, items []*consumer.Item) {
			for _, it := range items {
				if it.Event.ID != slow {
					continue
				}
				if !it.Alone {
					it.Later = true
					continue
				}
				alone.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
					it.Err = ctx.Err()
				}
			}
		},
		Apply: recordItems,
	})
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 3)
	require.Zero(t, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, slow))
	require.Equal(t, 1, b.count(`SELECT count(DISTINCT seq) FROM effects`), "the three in one transaction")
	close(release)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 4)
	b.settled(cfg.Durable)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, slow))
	require.EqualValues(t, 1, alone.Load(), "prepared alone once")
}

// A batch stops taking deliveries at MaxBatchWeight.
func TestBatchBoundedByWeight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	cfg.Weight = func(consumer.Event) int64 { return 10 }
	cfg.MaxBatchWeight = 30
	const n = 12
	b.burst(n)
	var mu sync.Mutex
	var sizes []int
	b.startStaged(cfg, consumer.Stages{Apply: func(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		return recordItems(ctx, tx, items)
	}})
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, n)
	b.settled(cfg.Durable)
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, s := range sizes {
		require.LessOrEqual(t, s, 3)
		total += s
	}
	require.Equal(t, n, total)
	require.Greater(t, n, len(sizes)-1, "batched at all")
}

// With MaxConcurrentBatches 1 one transaction runs at a time, and the
// deliveries arriving meanwhile wait in one batch, which grows instead of
// queueing.
func TestBatchesWaitForACommitSlotAndGrow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.batchConfig()
	cfg.MaxConcurrentBatches = 1
	cfg.MaxBatchWait = time.Nanosecond
	first := b.created("")
	release := make(chan struct{})
	var running, most atomic.Int32
	var mu sync.Mutex
	var sizes []int
	b.startStaged(cfg, consumer.Stages{Apply: func(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if items[0].Event.ID == first {
			<-release
		}
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		return recordItems(ctx, tx, items)
	}})
	require.Eventually(t, func() bool { return running.Load() == 1 }, waitLong, tick, "the first batch committing")
	const more = 10
	b.burst(more)
	require.Eventually(t, func() bool { return gauge(t, cfg.Registerer, "quill_consumer_handlers_running") == 1+more },
		waitLong, tick, "every delivery held")
	close(release)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1+more)
	b.settled(cfg.Durable)
	require.EqualValues(t, 1, most.Load(), "transactions at once")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, more}, sizes, "the deliveries that waited in one batch")
}

// memInbox is an Inbox of the service's own: a table with other columns.
type memInbox struct{}

func (memInbox) Record(ctx context.Context, tx pgx.Tx, events []consumer.Event) ([]bool, error) {
	fresh := make([]bool, len(events))
	for i, ev := range events {
		tag, err := tx.Exec(ctx, `INSERT INTO my_inbox (id) VALUES ($1) ON CONFLICT DO NOTHING`, ev.ID)
		if err != nil {
			return nil, err
		}
		fresh[i] = tag.RowsAffected() == 1
	}
	return fresh, nil
}

func (memInbox) Forget(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
	for _, ev := range events {
		if _, err := tx.Exec(ctx, `DELETE FROM my_inbox WHERE id = $1`, ev.ID); err != nil {
			return err
		}
	}
	return nil
}

// letters is a DeadLetterWriter of the service's own.
type letters struct {
	mu  sync.Mutex
	got []consumer.DeadLetter
}

func (l *letters) WriteDeadLetter(_ context.Context, dl consumer.DeadLetter) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, dl)
	return nil
}

// Config.Inbox and Config.DeadLetters replace the package's tables: the
// service's inbox tells a republished event a duplicate, and its writer
// receives the dead letters, with their cause.
func TestExternalInboxAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(t.Context(), `CREATE TABLE my_inbox (id uuid PRIMARY KEY)`)
	require.NoError(t, err)
	cfg := b.batchConfig()
	cfg.Inbox = memInbox{}
	dl := &letters{}
	cfg.DeadLetters = dl
	b.startStaged(cfg, consumer.Stages{Apply: recordItems})
	note := "0193aaaa-0000-7000-8000-000000000001"
	id := b.created(note)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	b.publish("quill."+b.tenant+".note.created", id+":again", b.event(id, note, "quill.note.created.v1"))
	b.publish("quill."+b.tenant+".note.created", "garbage-1", []byte("not json"))
	waitMetric(t, cfg.Registerer, consumer.ResultDuplicate, 1)
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	b.settled(cfg.Durable)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM my_inbox WHERE id = $1`, id))
	require.Zero(t, b.count(`SELECT count(*) FROM quill_consumer_inbox`))
	require.Empty(t, b.deadLetters())
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects`))
	dl.mu.Lock()
	defer dl.mu.Unlock()
	require.Len(t, dl.got, 1)
	require.Equal(t, "garbage-1", dl.got[0].Event.Delivery.Header.Get("Nats-Msg-Id"))
	require.Empty(t, dl.got[0].Event.ID)
	require.Contains(t, dl.got[0].Reason, "unparseable event")
	var inv *consumer.InvalidEventError
	require.ErrorAs(t, dl.got[0].Err, &inv)
	require.Equal(t, []byte("not json"), dl.got[0].Payload)
}
