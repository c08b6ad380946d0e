package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
)

// sample returns the value of the metric family name of reg, and its
// labels, failing when reg does not export it (once, unlabelled by
// anything but the consumer's constant labels).
func sample(t *testing.T, reg prometheus.Registerer, name string) (float64, map[string]string) {
	t.Helper()
	mfs, err := reg.(prometheus.Gatherer).Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		require.Len(t, mf.GetMetric(), 1, name)
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if c := m.GetCounter(); c != nil {
			return c.GetValue(), labels
		}
		return m.GetGauge().GetValue(), labels
	}
	t.Fatalf("%s is not exported", name)
	return 0, nil
}

// waitGauge waits until the metric name of reg is want.
func waitGauge(t *testing.T, reg prometheus.Registerer, name string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool { v, _ := sample(t, reg, name); return v == want }, waitLong, tick,
		"%s never reached %v", name, want)
}

// A consumer whose handlers hang acknowledges nothing: the gauge reads
// the backlog from JetStream — what it holds in its handlers and what the
// server has not delivered yet — and reads 0 once it is all handled.
func TestPendingMessagesShowAStalledConsumersBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Concurrency = 2
	cfg.PendingInterval = 20 * time.Millisecond
	release := make(chan struct{})
	c, err := consumer.New(b.pool, b.js, cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return record(ctx, tx, ev)
	})
	require.NoError(t, err)

	// Exported from New on, before Run, at 0.
	v, labels := sample(t, cfg.Registerer, "quill_consumer_pending_messages")
	require.Zero(t, v)
	require.Equal(t, map[string]string{"consumer": "projection", "stream": b.stream}, labels)
	acks, _ := sample(t, cfg.Registerer, "quill_consumer_acks_total")
	require.Zero(t, acks)

	const n = 5
	for range n {
		b.created("")
	}
	b.run(c)
	// Two in the hanging handlers (delivered, not acknowledged), three
	// not delivered.
	waitGauge(t, cfg.Registerer, "quill_consumer_pending_messages", n)
	acks, _ = sample(t, cfg.Registerer, "quill_consumer_acks_total")
	require.Zero(t, acks, "nothing was acknowledged")

	close(release)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, n)
	waitGauge(t, cfg.Registerer, "quill_consumer_acks_total", n)
	waitGauge(t, cfg.Registerer, "quill_consumer_pending_messages", 0)
	b.settled(cfg.Durable)
}

// With NATS away the gauge keeps the last backlog read, and a scrape
// answers at once: it never waits for NATS.
func TestPendingMessagesKeepTheLastValueWhileNATSIsAway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Concurrency = 1
	cfg.PendingInterval = 20 * time.Millisecond
	logs := &syncLog{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	release := make(chan struct{})
	c, err := consumer.New(b.pool, b.js, cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return record(ctx, tx, ev)
	})
	require.NoError(t, err)
	for range 3 {
		b.created("")
	}
	b.run(c)
	t.Cleanup(func() { close(release) }) // before the consumer stops: cleanups run last first
	waitGauge(t, cfg.Registerer, "quill_consumer_pending_messages", 3)

	b.srv.Stop()
	t.Cleanup(func() { b.srv.Restart(t) })
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "cannot read the consumer's backlog") },
		waitLong, tick, "the failed read is logged")
	start := time.Now()
	v, _ := sample(t, cfg.Registerer, "quill_consumer_pending_messages")
	require.Less(t, time.Since(start), time.Second, "a scrape does not wait for NATS")
	require.Equal(t, float64(3), v, "the last value read")
}

// quill_consumer_dead_letters counts the consumer's dead letters not yet
// re-driven as the table holds them, not as this process wrote them: one
// another process of the consumer wrote shows, another consumer's does
// not, and a retry as the command line makes it (Store.Redrive) no longer
// counts.
func TestDeadLettersCountTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	cfg := b.config()
	cfg.PendingInterval = 20 * time.Millisecond
	var fixed atomic.Bool
	c, err := consumer.New(b.pool, b.js, cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if !fixed.Load() {
			return consumer.Permanent(errors.New("a bug"))
		}
		return record(ctx, tx, ev)
	})
	require.NoError(t, err)
	v, labels := sample(t, cfg.Registerer, "quill_consumer_dead_letters")
	require.Zero(t, v, "exported from New on, at 0")
	require.Equal(t, map[string]string{"consumer": "projection"}, labels)
	b.run(c)

	id := b.created("")
	waitGauge(t, cfg.Registerer, "quill_consumer_dead_letters", 1)
	require.Equal(t, int64(1), c.DeadLetterCount())

	// In one transaction: a count that took the other consumer's would
	// read 3, never 2.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	other, err := consumer.NewStore(tx, "")
	require.NoError(t, err)
	letter := consumer.DeadLetter{Event: consumer.Event{ID: "not-an-event"}, Payload: []byte("x"), Reason: "elsewhere"}
	require.NoError(t, other.WriteDeadLetter(ctx, "another-consumer", letter, time.Now()))
	require.NoError(t, other.WriteDeadLetter(ctx, cfg.Durable, letter, time.Now()))
	require.NoError(t, tx.Commit(ctx))
	waitGauge(t, cfg.Registerer, "quill_consumer_dead_letters", 2)
	require.Never(t, func() bool { v, _ := sample(t, cfg.Registerer, "quill_consumer_dead_letters"); return v != 2 },
		10*cfg.PendingInterval, tick, "another consumer's dead letter counted")

	store, err := consumer.NewStore(b.pool, "")
	require.NoError(t, err)
	open, err := store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: cfg.Durable})
	require.NoError(t, err)
	require.Len(t, open, 2)
	require.Equal(t, id, open[0].EventID)
	fixed.Store(true)
	_, err = store.Redrive(ctx, b.js, open[0], time.Now())
	require.NoError(t, err)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	waitGauge(t, cfg.Registerer, "quill_consumer_dead_letters", 1)
	require.Equal(t, int64(1), c.DeadLetterCount())
	b.settled(cfg.Durable)
}

// With the table unreadable the gauge keeps the last count, the failure
// is logged once however many reads fail, and the count resumes when the
// table is back.
func TestDeadLettersKeepTheLastCountWhileTheTableIsAway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	cfg := b.config()
	cfg.PendingInterval = 20 * time.Millisecond
	logs := &syncLog{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	store, err := consumer.NewStore(b.pool, "")
	require.NoError(t, err)
	letter := consumer.DeadLetter{Event: consumer.Event{ID: "not-an-event"}, Payload: []byte("x"), Reason: "boom"}
	for range 2 {
		require.NoError(t, store.WriteDeadLetter(ctx, cfg.Durable, letter, time.Now()))
	}
	c, _ := b.start(cfg, record)
	waitGauge(t, cfg.Registerer, "quill_consumer_dead_letters", 2)

	// A fault in the test's own schema: the count's table is gone.
	_, err = b.pool.Exec(ctx, `ALTER TABLE quill_consumer_dead_letters RENAME TO away`)
	require.NoError(t, err)
	const failed = "cannot count the consumer's dead letters"
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), failed) }, waitLong, tick, "the failed count is logged")
	time.Sleep(10 * cfg.PendingInterval) // more failed counts
	// The missing table is one reason, logged once; a count that ran out
	// of its interval on a loaded machine is another, logged once too.
	require.Equal(t, 1, strings.Count(logs.String(), "does not exist"), "logged once per reason: %s", logs.String())
	v, _ := sample(t, cfg.Registerer, "quill_consumer_dead_letters")
	require.Equal(t, float64(2), v, "the last count")
	require.Equal(t, int64(2), c.DeadLetterCount())

	_, err = b.pool.Exec(ctx, `ALTER TABLE away RENAME TO quill_consumer_dead_letters`)
	require.NoError(t, err)
	require.NoError(t, store.WriteDeadLetter(ctx, cfg.Durable, letter, time.Now()))
	waitGauge(t, cfg.Registerer, "quill_consumer_dead_letters", 3)
}

// syncLog is a log destination safe for concurrent writes.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
