package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/testkit"
)

// quill_worker_dead_letters counts the consumer's dead letters that no one
// has retried, as the table says: a retry from the command line or a dead
// letter of another process shows at the next count.
func TestDeadLettersCountsOpenOnes(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	ctx := t.Context()
	insert := func(consumer string, retried bool) int64 {
		var id int64
		var retriedAt *time.Time
		if retried {
			now := time.Now()
			retriedAt = &now
		}
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO quill_consumer_dead_letters
			(consumer, event_id, event_type, stream_seq, subject, payload, headers, reason, deliveries, created_at, retried_at)
			VALUES ($1, 'e', '', 1, 'quill.t.note.created', '\x00', '{}', 'boom', 10, now(), $2) RETURNING id`, consumer, retriedAt).Scan(&id))
		return id
	}
	first := insert("attachment-worker", false)
	insert("attachment-worker", true)
	insert("other-consumer", false)

	reg := prometheus.NewRegistry()
	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	d := metrics.NewDeadLetters(reg, store, "attachment-worker", zerolog.Nop())
	require.Equal(t, 0.0, testkit.Gathered(t, reg, "quill_worker_dead_letters", nil), "exported from start-up")
	d.Interval = 20 * time.Millisecond
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	gauge := func() float64 { return testkit.Gathered(t, reg, "quill_worker_dead_letters", nil) }
	testkit.WaitFor(t, 10*time.Second, func() bool { return gauge() == 1 }, "one open dead letter of this consumer")

	insert("attachment-worker", false)
	testkit.WaitFor(t, 10*time.Second, func() bool { return gauge() == 2 }, "a new dead letter counted")
	_, err = pool.Exec(ctx, `UPDATE quill_consumer_dead_letters SET retried_at = now() WHERE id = $1`, first)
	require.NoError(t, err)
	testkit.WaitFor(t, 10*time.Second, func() bool { return gauge() == 1 }, "a retried dead letter no longer counted")
}
