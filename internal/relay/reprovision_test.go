package relay_test

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/testkit"
)

// TestStreamDeletedWhileRunning: the stream is deleted while two relays run
// and events keep coming. The relays provision it again (counted in
// quill_relay_stream_reprovisions_total), park nothing, and every event
// written after the deletion reaches the re-created stream exactly once, in
// commit order per note.
func TestStreamDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	a, ma := h.newRelay(cfg, h.relayID("a"))
	b, mb := h.newRelay(cfg, h.relayID("b"))
	require.NoError(t, a.Provision(h.ctx()))
	start(t, a)
	start(t, b)

	notes := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	types := []string{contract.EventNoteCreated, contract.EventAttachmentProcessed, contract.EventNoteDeleted}
	for _, n := range notes {
		h.write(h.tenant, n, contract.EventNoteCreated)
	}
	h.waitPublished(len(notes))

	require.NoError(t, h.js.DeleteStream(h.ctx(), h.stream))
	after := map[string]bool{}
	laterNotes := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	for _, typ := range types {
		for _, n := range laterNotes {
			after[h.write(h.tenant, n, typ).String()] = true
		}
	}
	total := len(notes) + len(after)
	h.waitPublished(total)

	rows := h.rows()
	for _, r := range rows {
		require.False(t, r.Parked, "event %s parked: %s", r.ID, r.ParkedReason)
	}
	require.Zero(t, h.count(`SELECT count(*) FROM outbox_events WHERE parked_at IS NOT NULL`))
	require.GreaterOrEqual(t, testkit.Value(ma.Reprovisions)+testkit.Value(mb.Reprovisions), 1.0)

	st, err := h.js.Stream(h.ctx(), h.stream)
	require.NoError(t, err, "the stream was provisioned again")
	require.Equal(t, []string{h.prefix + ".>"}, st.CachedInfo().Config.Subjects)
	msgs := streamMessages(t, h.js, h.stream)
	seen := map[string]bool{}
	perNote := map[string][]string{}
	for _, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		require.False(t, seen[id], "event %s is in the stream twice", id)
		seen[id] = true
		require.True(t, after[id], "event %s was published before the deletion", id)
		var ce cloudEvent
		require.NoError(t, json.Unmarshal(m.Data, &ce))
		perNote[ce.Subject] = append(perNote[ce.Subject], id)
	}
	require.Len(t, seen, len(after), "every event written after the deletion, once")
	want := map[string][]string{}
	for _, r := range rows {
		if after[r.ID.String()] {
			want[r.Aggregate.String()] = append(want[r.Aggregate.String()], r.ID.String())
		}
	}
	require.Equal(t, want, perNote, "each note's events in commit order")
}
