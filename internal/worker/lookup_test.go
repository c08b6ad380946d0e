package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// The lookup of a create lists every effect the operation caused (SPEC
// §4.6), the worker's attachment.processed event included: the worker
// writes it under the create's operation key, so it is listed while in the
// outbox and, once the cleanup deleted it, from the record.
func TestCreateLookupListsTheWorkersEvent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startWorker(h.config(), "")
	data := []byte("hello\n")
	sum := sha256.Sum256(data)
	const key = "create-with-attachment"
	_, err := h.svc.Create(context.Background(), notes.Request{Tenant: h.tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite},
		notes.CreateParams{Title: "t", Attachment: &notes.NewAttachment{Filename: "a.txt", ContentType: "text/plain", Data: data, SHA256: hex.EncodeToString(sum[:])}})
	require.NoError(t, err)

	var op *notes.Operation
	testkit.WaitFor(t, waitLong, func() bool {
		op, err = h.svc.Lookup(context.Background(), h.tenant, key)
		require.NoError(t, err)
		return len(op.Effects) == 3
	}, "the lookup lists the note.created event, the worker's event and the attachment")
	var kinds []string
	for _, e := range op.Effects {
		kinds = append(kinds, e.Kind+":"+e.Type)
	}
	require.Equal(t, []string{"event:quill.note.created.v1", "event:quill.attachment.processed.v1", "attachment:"}, kinds)
	require.Equal(t, worker.StateProcessed, op.Effects[2].State)

	// Published and then deleted by the cleanup: still listed, from the
	// record.
	testkit.WaitFor(t, waitLong, func() bool {
		var pending int
		require.NoError(t, h.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM outbox_events WHERE tenant = $1 AND published_at IS NULL`, h.tenant).Scan(&pending))
		return pending == 0
	}, "both events published")
	_, err = h.pool.Exec(context.Background(), `DELETE FROM outbox_events WHERE tenant = $1`, h.tenant)
	require.NoError(t, err)
	op, err = h.svc.Lookup(context.Background(), h.tenant, key)
	require.NoError(t, err)
	require.Len(t, op.Effects, 3)
	require.Equal(t, notes.EventPublished, op.Effects[1].State)
	require.Equal(t, "quill.attachment.processed.v1", op.Effects[1].Type)
}
