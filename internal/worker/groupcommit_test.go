package worker_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// batchConfig groups every event delivered within a second into one
// transaction.
func (h *harness) batchConfig() worker.Config {
	cfg := h.config()
	cfg.Consumer.Concurrency = 16
	cfg.Consumer.MaxBatch = 16
	cfg.Consumer.MaxBatchWait = time.Second
	return cfg
}

// publishedEvents waits for n note.created events in the stream and
// returns them.
func (h *harness) publishedEvents(n int) []*nats.Msg {
	h.t.Helper()
	var out []*nats.Msg
	testkit.WaitFor(h.t, waitLong, func() bool {
		msgs := natstest.StreamMessages(h.t, h.js, h.stream, h.prefix+".*.note.created")
		out = out[:0]
		for _, m := range msgs {
			nm := nats.NewMsg(m.Subject)
			nm.Data, nm.Header = m.Data, m.Header
			out = append(out, nm)
		}
		return len(out) == n
	}, "note.created events published")
	return out
}

func (h *harness) eventID(payload []byte) uuid.UUID {
	h.t.Helper()
	var e struct {
		ID string `json:"id"`
	}
	require.NoError(h.t, json.Unmarshal(payload, &e))
	return uuid.MustParse(e.ID)
}

// inboxRow is the counts of consumer's inbox row of event id.
type inboxRow struct{ Deliveries, Duplicates int }

func (h *harness) inboxRow(consumer string, id uuid.UUID) inboxRow {
	h.t.Helper()
	var r inboxRow
	require.NoError(h.t, h.pool.QueryRow(h.t.Context(), `SELECT deliveries, duplicates FROM quill_consumer_inbox WHERE consumer = $1 AND event_id = $2`,
		consumer, id).Scan(&r.Deliveries, &r.Duplicates))
	return r
}

// One event of a batch whose note does not exist (it can never be
// processed: a dead letter at once) fails alone: its neighbours in the same
// transaction commit, and its inbox row is not left behind.
func TestBatchPoisonedEventFailsAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.batchConfig()
	var ids []uuid.UUID
	for i := range 5 {
		ids = append(ids, h.create(title(i), "text/plain", []byte("neighbour")))
	}
	h.publishedEvents(5)
	ghost := uuid.Must(uuid.NewV7())
	payload, err := outbox.Envelope(outbox.Event{ID: ghost, Tenant: h.tenant, AggregateID: uuid.New(), Type: contract.EventNoteCreated,
		Time: time.Now(), Data: map[string]any{"id": uuid.NewString(), "attachment": map[string]any{
			"id": uuid.NewString(), "sha256": "00", "size": 1, "content_type": "text/plain", "filename": "ghost.txt"}}})
	require.NoError(t, err)
	msg := nats.NewMsg(h.prefix + "." + h.tenant + ".note.created")
	msg.Data = payload
	_, err = h.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)

	m, _ := h.startWorker(cfg, "")
	for _, id := range ids {
		h.waitStatus(id, worker.StateProcessed)
		require.Equal(t, 1, h.processedEvents(id))
	}
	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDeadLettered)) == 1 }, "the ghost dead-lettered")
	_, _, largest := h.workers[0].BatchStats()
	require.Equal(t, int64(6), largest, "the six events in one transaction")
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerProcessed), 5.0)
	require.Zero(t, h.count(`SELECT count(*) FROM quill_consumer_inbox WHERE event_id = $1`, ghost))
	require.Equal(t, 5, h.count(`SELECT count(*) FROM quill_consumer_inbox`))
	letters, err := h.deadLetters(cfg.Consumer.Durable, false)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, ghost.String(), letters[0].EventID)
	require.Contains(t, letters[0].Reason, "has no attachment in this database")
}

// poisonedBatchConfig is batchConfig with two deliveries and no in-process
// retries, over a schema where every update of the attachment
// "poison.txt" out of pending fails: a statement that fails for one event
// of a batch.
func (h *harness) poisonedBatchConfig() worker.Config {
	h.t.Helper()
	cfg := h.batchConfig()
	cfg.Consumer.MaxDeliver = 2
	cfg.Consumer.Retries = -1
	_, err := h.pool.Exec(h.t.Context(), `
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.filename = 'poison.txt' AND NEW.status <> 'pending' THEN
		RAISE EXCEPTION 'poisoned attachment';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE UPDATE ON attachments FOR EACH ROW EXECUTE FUNCTION refuse_poison();`)
	require.NoError(h.t, err)
	return cfg
}

// A statement that fails for one event aborts the whole batch transaction;
// the batch is then committed event by event, so the neighbours commit once
// each and only the broken event is retried — and, failing every delivery,
// dead-lettered.
func TestBatchStatementFailureRetriedOneByOne(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.poisonedBatchConfig()
	var ids []uuid.UUID
	for i := range 4 {
		ids = append(ids, h.create(title(i), "text/plain", []byte("neighbour")))
	}
	poison := h.create("poison.txt", "text/plain", []byte("poison"))
	h.publishedEvents(5)

	m, _ := h.startWorker(cfg, "")
	for _, id := range ids {
		h.waitStatus(id, worker.StateProcessed)
	}
	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDeadLettered)) == 1 }, "the poisoned event dead-lettered")
	_, _, largest := h.workers[0].BatchStats()
	require.Equal(t, int64(5), largest, "the five events in one transaction")
	for _, id := range ids {
		require.Equal(t, 1, h.processedEvents(id))
	}
	require.Equal(t, "pending", h.attachment(poison).Status)
	require.Equal(t, 0, h.processedEvents(poison))
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerProcessed), 4.0)
	require.Equal(t, 0.0, testkit.Value(m.Messages(metrics.WorkerDuplicate)))
	require.Equal(t, 4, h.count(`SELECT count(*) FROM quill_consumer_inbox`))
	letters, err := h.deadLetters(cfg.Consumer.Durable, false)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Contains(t, letters[0].Reason, "poisoned attachment")
}

// The same event delivered twice in one batch (republished with a new
// Nats-Msg-Id) is processed once: one delivery processed, the other a
// duplicate counted in the inbox row; a later redelivery counts again.
func TestBatchDuplicateInSameBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.batchConfig()
	note := h.create("a.txt", "text/plain", []byte("one two three"))
	other := h.create("b.txt", "text/plain", []byte("four five"))
	h.publishedEvents(2)
	again := nats.NewMsg(h.prefix + "." + h.tenant + ".note.created")
	again.Data = h.createdPayload(note)
	again.Header.Set(nats.MsgIdHdr, "again-1")
	_, err := h.js.PublishMsg(t.Context(), again)
	require.NoError(t, err)

	m, _ := h.startWorker(cfg, "")
	h.waitStatus(note, worker.StateProcessed)
	h.waitStatus(other, worker.StateProcessed)
	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDuplicate)) == 1 }, "a duplicate")
	_, _, largest := h.workers[0].BatchStats()
	require.Equal(t, int64(3), largest, "the three deliveries in one transaction")
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerProcessed), 2.0)
	require.Equal(t, 1, h.processedEvents(note))
	require.Equal(t, 2, h.count(`SELECT count(*) FROM quill_consumer_inbox`))
	id := h.eventID(again.Data)
	r := h.inboxRow(cfg.Consumer.Durable, id)
	require.Equal(t, 1, r.Duplicates)
	require.Equal(t, 1, r.Deliveries)
	require.Equal(t, 0, h.inboxRow(cfg.Consumer.Durable, h.eventID(h.createdPayload(other))).Duplicates)

	// Once more, in a transaction of its own.
	again.Header.Set(nats.MsgIdHdr, "again-2")
	_, err = h.js.PublishMsg(t.Context(), again)
	require.NoError(t, err)
	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDuplicate)) == 2 }, "a second duplicate")
	require.Equal(t, 2, h.inboxRow(cfg.Consumer.Durable, id).Duplicates)
	require.Equal(t, 1, h.processedEvents(note))
}

// The inbox row keeps the delivery count of the message whose processing
// committed, and counts the duplicates recognised later — a crash between
// the commit and the acknowledgement makes one.
func TestInboxCounts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Consumer.Retries = -1 // every failure is a real redelivery
	var failed, crashed atomic.Int32
	m, _ := h.startWorker(cfg, "", worker.WithHooks(worker.Hooks{
		BeforeProcess: func(_ string, delivery int) error {
			if delivery < 3 {
				failed.Add(1)
				return errInjected
			}
			return nil
		},
		AfterCommit: func(string) error {
			if crashed.Add(1) == 1 {
				return errInjected
			}
			return nil
		},
	}))
	note := h.create("a.txt", "text/plain", []byte("counted"))
	h.waitStatus(note, worker.StateProcessed)
	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDuplicate)) == 1 }, "the redelivery after the crash a duplicate")
	r := h.inboxRow(cfg.Consumer.Durable, h.eventID(h.createdPayload(note)))
	require.Equal(t, 3, r.Deliveries, "committed on the third delivery")
	require.Equal(t, 1, r.Duplicates)
	require.EqualValues(t, 2, failed.Load())
	require.Equal(t, 1, h.processedEvents(note))
}

// createdPayload is the note.created event of note, from the outbox.
func (h *harness) createdPayload(note uuid.UUID) []byte {
	h.t.Helper()
	var p []byte
	require.NoError(h.t, h.pool.QueryRow(h.t.Context(),
		`SELECT payload FROM outbox_events WHERE type = 'note.created' AND aggregate_id = $1`, note).Scan(&p))
	return p
}

// A batch whose transaction fails is redone event by event with the
// results already computed: each attachment is processed once, however
// often its event's transaction is tried.
func TestBatchFallbackKeepsTheProcessing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.poisonedBatchConfig()
	for i := range 3 {
		h.create(title(i), "text/plain", []byte("neighbour"))
	}
	h.create("poison.txt", "text/plain", []byte("poison"))
	h.publishedEvents(4)
	var mu sync.Mutex
	processed := map[string]int{}
	m, _ := h.startWorker(cfg, "", worker.WithHooks(worker.Hooks{Processing: func(id string) {
		mu.Lock()
		processed[id]++
		mu.Unlock()
	}}))
	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDeadLettered)) == 1 }, "the poisoned event dead-lettered")
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerProcessed), 3.0)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, processed, 4)
	for id, n := range processed {
		require.Equal(t, 1, n, "event %s processed", id)
	}
}
