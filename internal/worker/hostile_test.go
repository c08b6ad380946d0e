package worker_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// eventOfNote returns the event id of note's note.created event among msgs.
func (h *harness) eventOfNote(msgs []*nats.Msg, note uuid.UUID) string {
	h.t.Helper()
	for _, m := range msgs {
		var e struct {
			ID      string `json:"id"`
			Subject string `json:"subject"`
		}
		require.NoError(h.t, json.Unmarshal(m.Data, &e))
		if e.Subject == note.String() {
			return e.ID
		}
	}
	h.t.Fatalf("no event for note %s", note)
	return ""
}

// One attachment whose processing outlasts the batch's deadline (a hook
// holds it until the test lets it go) does not fail the other events of its
// batch: they commit while it still processes. Meanwhile its note is not
// locked: another connection with a short lock_timeout deletes it, and the
// worker, re-checking the note under its lock once the processing ends,
// records the event as skipped rather than storing a result for a deleted
// note.
func TestSlowAttachmentDelaysOnlyItself(t *testing.T) {
	t.Parallel()
	h, cfg, ids, slow := batchOfFive(t, "slow.txt")
	slowEvent := h.eventOfNote(h.publishedEvents(5), slow)

	release := make(chan struct{})
	started := make(chan struct{})
	var once, startOnce sync.Once
	m, _ := h.startWorker(cfg, "", worker.WithHooks(worker.Hooks{Processing: func(eventID string) {
		if eventID == slowEvent {
			startOnce.Do(func() { close(started) })
			<-release
		}
	}}))
	// Registered after the worker's stop, so it runs first.
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	<-started
	for _, id := range ids {
		h.waitStatus(id, worker.StateProcessed)
	}
	_, _, largest := h.workers[0].BatchStats()
	require.Equal(t, int64(5), largest, "the five events in one batch")
	require.Equal(t, "pending", h.attachment(slow).Status)

	// The note is not locked while its attachment is processed.
	require.NoError(t, pgx.BeginFunc(t.Context(), h.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), `SET LOCAL lock_timeout = '200ms'`); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), `UPDATE notes SET deleted_at = now() WHERE id = $1`, slow)
		return err
	}), "deleting the note while its attachment is processed")

	once.Do(func() { close(release) })
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerSkipped), 1.0)
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerProcessed), 4.0)
	r := h.attachment(slow)
	require.Equal(t, "pending", r.Status)
	require.NotNil(t, r.Reason)
	require.Equal(t, worker.ReasonNoteDeleted, *r.Reason)
	require.Zero(t, h.processedEvents(slow))
	require.Zero(t, testkit.Value(m.Messages(metrics.WorkerDeadLettered)))
}

// An event whose tenant is not a tenant name, or not the tenant of the
// subject it came on, is a dead letter at once, with a reason saying so; it
// touches nothing.
func TestEventTenantMustMatchItsSubject(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	note := h.create("mine.txt", "text/plain", []byte("mine"))
	msgs := h.publishedEvents(1)
	var real outbox.CloudEvent
	require.NoError(t, json.Unmarshal(msgs[0].Data, &real, json.RejectUnknownMembers(false)))
	cases := []struct {
		name, source, subjectTenant, reason string
	}{
		{"another tenant's subject", "/tenants/" + h.tenant, "other-" + h.suffix, `delivered on subject "` + h.prefix + `.other-` + h.suffix + `.note.created", whose tenant is "other-` + h.suffix + `"`},
		{"another tenant's event on this subject", "/tenants/other-" + h.suffix, h.tenant, `event of tenant "other-` + h.suffix + `"`},
		{"not a tenant name", "/tenants/Bad_Tenant", h.tenant, `"Bad_Tenant", which is not a valid tenant name`},
	}
	for _, tc := range cases {
		ev := real
		ev.ID, ev.Source = uuid.NewString(), tc.source
		payload, err := json.Marshal(ev)
		require.NoError(t, err)
		m := nats.NewMsg(h.prefix + "." + tc.subjectTenant + ".note.created")
		m.Data = payload
		_, err = h.js.PublishMsg(t.Context(), m)
		require.NoError(t, err, tc.name)
	}

	m, _ := h.startWorker(h.config(), "")
	h.waitStatus(note, worker.StateProcessed)
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerDeadLettered), 3.0)
	letters, err := h.deadLetters(h.config().Consumer.Durable, false)
	require.NoError(t, err)
	require.Len(t, letters, 3)
	var all strings.Builder
	for _, l := range letters {
		all.WriteString(l.Reason + "\n")
	}
	for _, tc := range cases {
		require.Contains(t, all.String(), tc.reason, tc.name)
	}
	require.Equal(t, 1, h.processedEvents(note), "the one real event, once")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM quill_consumer_inbox`))
}

// An image heavier than the whole decode budget is not decoded and never
// waits for room: it fails for good (status failed, its reason naming its
// weight and the budget), acknowledged, not retried or dead-lettered; an
// image within the budget beside it is processed.
func TestImageOverTheDecodeBudgetFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	big, small := pngOf(t, 400, 300), pngOf(t, 40, 30)
	cfg := h.config()
	cfg.DecodeMemory = attachment.DecodeMemory(big) - 1
	require.Greater(t, cfg.DecodeMemory, attachment.DecodeMemory(small))
	bigNote := h.create("big.png", "image/png", big)
	smallNote := h.create("small.png", "image/png", small)
	m, _ := h.startWorker(cfg, "")
	r := h.waitStatus(bigNote, worker.StateFailed)
	require.NotNil(t, r.Reason)
	require.Equal(t, fmt.Sprintf("image too large: 400x300 image/png needs %d bytes to decode, the budget is %d (not decoded)",
		attachment.DecodeMemory(big), cfg.DecodeMemory), *r.Reason)
	h.waitStatus(smallNote, worker.StateProcessed)
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerFailed), 1.0)
	require.Zero(t, testkit.Value(m.Messages(metrics.WorkerDeadLettered)))
	require.Equal(t, 1, h.processedEvents(bigNote), "its attachment.processed event says failed")
}

// A batch whose transaction outlasts its deadline — here it waits for a
// note another transaction holds locked — is not "database unavailable":
// its events are committed one by one, so the neighbours commit while the
// lock is still held, and the locked one once it is released.
func TestBatchPastItsDeadlineCommitsOneByOne(t *testing.T) {
	t.Parallel()
	h, cfg, ids, locked := batchOfFive(t, "locked.txt")
	h.publishedEvents(5)

	tx, err := h.pool.Begin(t.Context())
	require.NoError(t, err)
	defer tx.Rollback(t.Context())
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM notes WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)

	m, _ := h.startWorker(cfg, "")
	for _, id := range ids {
		h.waitStatus(id, worker.StateProcessed)
	}
	require.Equal(t, "pending", h.attachment(locked).Status)
	_, _, largest := h.workers[0].BatchStats()
	require.Equal(t, int64(5), largest, "the five events in one batch")
	require.NoError(t, tx.Rollback(t.Context()))
	h.waitStatus(locked, worker.StateProcessed)
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerProcessed), 5.0)
	for _, id := range append(ids, locked) {
		require.Equal(t, 1, h.processedEvents(id))
	}
}

// batchOfFive sets up one batch of five text attachments under a short
// AckWait (the batch's deadline is half of it): four neighbours, and last,
// the note the test acts on.
func batchOfFive(t *testing.T, last string) (h *harness, cfg worker.Config, neighbours []uuid.UUID, lastNote uuid.UUID) {
	t.Helper()
	h = newHarness(t)
	cfg = h.batchConfig()
	cfg.Consumer.AckWait = 2 * time.Second
	cfg.Consumer.MaxBatchWait = 500 * time.Millisecond
	for i := range 4 {
		neighbours = append(neighbours, h.create(title(i), "text/plain", []byte("neighbour")))
	}
	return h, cfg, neighbours, h.create(last, "text/plain", []byte(strings.TrimSuffix(last, ".txt")))
}
