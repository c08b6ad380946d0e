package worker_test

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// The inbox alone stops a repeat: with the attachment put back to pending
// (so the "no longer pending" guard cannot tell), the event delivered again
// under a new Nats-Msg-Id is still a duplicate, and nothing is written.
func TestInboxAloneStopsARepeat(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	m, _ := h.startWorker(h.config(), "")
	note := h.create("a.txt", "text/plain", []byte("one two three"))
	h.waitStatus(note, worker.StateProcessed)
	_, err := h.pool.Exec(t.Context(), `UPDATE attachments SET status = 'pending', result = NULL, processed_at = NULL WHERE note_id = $1`, note)
	require.NoError(t, err)

	h.republishNoteCreated()

	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDuplicate)) == 1 }, "a duplicate")
	testkit.RequireMetric(t, waitLong, m.Messages(metrics.WorkerProcessed), 1.0)
	require.Equal(t, "pending", h.attachment(note).Status, "the repeat wrote nothing")
	require.Equal(t, 1, h.processedEvents(note))
}

// An event naming an attachment that is not its note's is refused for good:
// a dead letter with no effect; the genuine event is processed once.
func TestEventForAnotherAttachmentDeadLettered(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	note := h.create("a.txt", "text/plain", []byte("one two three"))
	testkit.WaitFor(t, waitLong, func() bool {
		return h.count(`SELECT count(*) FROM outbox_events WHERE published_at IS NULL`) == 0
	}, "note.created published")
	msgs := natstest.StreamMessages(t, h.js, h.stream, h.prefix+".*.note.created")
	require.Len(t, msgs, 1)
	var ev map[string]any
	require.NoError(t, json.Unmarshal(msgs[0].Data, &ev))
	ev["id"] = uuid.NewString()
	other := uuid.NewString()
	ev["data"].(map[string]any)["attachment"].(map[string]any)["id"] = other
	forged := nats.NewMsg(msgs[0].Subject)
	forged.Data, _ = json.Marshal(ev)
	forged.Header.Set(nats.MsgIdHdr, ev["id"].(string))
	_, err := h.js.PublishMsg(t.Context(), forged)
	require.NoError(t, err)
	m, _ := h.startWorker(cfg, "")

	testkit.WaitFor(t, waitLong, func() bool { return testkit.Value(m.Messages(metrics.WorkerDeadLettered)) == 1 }, "a dead letter")
	letters, err := h.deadLetters(cfg.Consumer.Durable, false)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Contains(t, letters[0].Reason, "attachment "+other)
	h.waitStatus(note, worker.StateProcessed)
	require.Equal(t, 1, h.processedEvents(note))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM quill_consumer_inbox`), "the refused event is not remembered")
}
