package consumer_test

import (
	"context"
	"fmt"
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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/consumer/internal/testenv"
)

const (
	waitLong = 30 * time.Second
	tick     = 20 * time.Millisecond
)

// bundle is one test's world: an empty schema migrated with the consumer's
// tables and an effects table, and a NATS server of its own with a stream.
type bundle struct {
	t      *testing.T
	pool   *pgxpool.Pool
	srv    *testenv.NATS
	js     jetstream.JetStream
	stream string
	tenant string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testenv.EmptySchema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, consumer.Migrate(ctx, pool))
	// No key: a second effect of one event would show as a second row.
	_, err = pool.Exec(ctx, `CREATE TABLE effects (n bigint GENERATED ALWAYS AS IDENTITY, event_id uuid NOT NULL, subject text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(t, err)
	srv := testenv.StartNATS(t)
	_, js := srv.Connect(t)
	b := &bundle{t: t, pool: pool, srv: srv, js: js, stream: "EVENTS", tenant: "acme"}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{"quill.>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	return b
}

// config is a test consumer's configuration: quick redeliveries.
func (b *bundle) config() consumer.Config {
	return consumer.Config{Durable: "projection", Stream: b.stream, AckWait: 2 * time.Second,
		NakDelay: 10 * time.Millisecond, MaxNakDelay: 50 * time.Millisecond, RetryInterval: 5 * time.Millisecond,
		Registerer: prometheus.NewRegistry()}
}

// record is the effect handler: one row per handled event.
func record(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, subject, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Subject, int64(ev.Delivery.StreamSeq))
	return err
}

// start runs a consumer until the test ends or the returned stop is called
// (which returns Run's error).
func (b *bundle) start(cfg consumer.Config, h consumer.Handler) (*consumer.Consumer, func() error) {
	b.t.Helper()
	c, err := consumer.New(b.pool, b.js, cfg, h)
	require.NoError(b.t, err)
	return c, b.run(c)
}

// run runs c until the test ends or the returned stop is called (which
// returns Run's error).
func (b *bundle) run(c *consumer.Consumer) func() error {
	t := b.t
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(waitLong):
				runErr = fmt.Errorf("Run did not return within %s", waitLong)
			}
		})
		return runErr
	}
	t.Cleanup(func() { require.NoError(t, stop()) })
	return stop
}

// event is a CloudEvent of Quill's form about note.
func (b *bundle) event(id, note, typ string) []byte {
	p, err := json.Marshal(map[string]any{
		"specversion": "1.0", "id": id, "source": "/tenants/" + b.tenant, "type": typ, "subject": note,
		"time": "2026-12-01T10:00:00.000000Z", "datacontenttype": "application/json",
		"data": map[string]any{"id": note},
	})
	require.NoError(b.t, err)
	return p
}

// publish publishes payload on subject with msgID as Nats-Msg-Id and
// returns its stream sequence.
func (b *bundle) publish(subject, msgID string, payload []byte) uint64 {
	m := nats.NewMsg(subject)
	m.Data = payload
	m.Header.Set(nats.MsgIdHdr, msgID)
	ack, err := b.js.PublishMsg(b.t.Context(), m)
	require.NoError(b.t, err)
	require.False(b.t, ack.Duplicate)
	return ack.Sequence
}

// created publishes a note.created event of note (a new one when "") and
// returns the event id.
func (b *bundle) created(note string) string {
	if note == "" {
		note = uuid.NewString()
	}
	id := uuid.NewString()
	b.publish("quill."+b.tenant+".note.created", id, b.event(id, note, "quill.note.created.v1"))
	return id
}

func (b *bundle) count(sql string, args ...any) int {
	var n int
	require.NoError(b.t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// settled waits until the server holds nothing pending or unacknowledged
// for the durable consumer.
func (b *bundle) settled(durable string) {
	b.t.Helper()
	require.EventuallyWithT(b.t, func(c *assert.CollectT) {
		cons, err := b.js.Consumer(context.Background(), b.stream, durable)
		if !assert.NoError(c, err) {
			return
		}
		info, err := cons.Info(context.Background())
		if !assert.NoError(c, err) {
			return
		}
		assert.Equal(c, 0, info.NumAckPending, "unacknowledged")
		assert.Equal(c, uint64(0), info.NumPending, "pending")
	}, waitLong, tick)
}

// metric returns the value of quill_consumer_messages_total{result}.
func metric(t *testing.T, reg prometheus.Registerer, result string) float64 {
	t.Helper()
	mfs, err := reg.(prometheus.Gatherer).Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "quill_consumer_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no quill_consumer_messages_total{result=%q}", result)
	return 0
}

// waitMetric waits until quill_consumer_messages_total{result} is want.
func waitMetric(t *testing.T, reg prometheus.Registerer, result string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool { return metric(t, reg, result) == want }, waitLong, tick,
		"quill_consumer_messages_total{result=%q} never reached %v", result, want)
}

// deadLetter is a row of the dead-letter table.
type deadLetter struct {
	EventID, Subject, Reason string
	Seq                      int64
	Deliveries               int
	Payload                  []byte
}

func (b *bundle) deadLetters() []deadLetter {
	rows, err := b.pool.Query(context.Background(), `SELECT event_id, subject, reason, stream_seq, deliveries, payload
		FROM quill_consumer_dead_letters ORDER BY stream_seq`)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) {
		var d deadLetter
		err := r.Scan(&d.EventID, &d.Subject, &d.Reason, &d.Seq, &d.Deliveries, &d.Payload)
		return d, err
	})
	require.NoError(b.t, err)
	return out
}
