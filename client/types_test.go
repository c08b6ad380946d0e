package client_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
)

// A lookup as SPEC §4.6 writes it — pending effects with their members
// present and null — decodes, nulls as nil pointers.
func TestOperationDecodesNullMembersOfPendingEffects(t *testing.T) {
	t.Parallel()
	body := `{"key": "k", "action": "create-note", "state": "completed",
		"created_at": "2026-12-01T00:00:00.000000Z", "completed_at": "2026-12-01T00:00:00.000100Z",
		"expires_at": "2026-12-04T00:00:00.000100Z", "resource": "/v1/notes/n", "response": null,
		"effects": [
			{"kind": "event", "id": "e1", "type": "quill.note.created.v1", "state": "pending", "published_at": null, "stream_seq": null},
			{"kind": "event", "id": "e2", "type": "quill.note.deleted.v1", "state": "published", "published_at": "2026-12-01T00:00:01.000000Z", "stream_seq": 9},
			{"kind": "attachment", "id": "a", "state": "pending", "processed_at": null},
			{"kind": "event", "id": null, "type": "quill.note.created.v1", "state": "forgotten", "published_at": null, "stream_seq": null}
		]}`
	var op client.Operation
	require.NoError(t, json.Unmarshal([]byte(body), &op))
	require.Len(t, op.Effects, 4)
	pending, published, att := op.Effects[0], op.Effects[1], op.Effects[2]
	require.Equal(t, "pending", pending.State)
	require.Nil(t, pending.PublishedAt)
	require.Nil(t, pending.StreamSeq)
	require.Equal(t, time.Date(2026, 12, 1, 0, 0, 1, 0, time.UTC), *published.PublishedAt)
	require.EqualValues(t, 9, *published.StreamSeq)
	require.Equal(t, "attachment", att.Kind)
	require.Nil(t, att.ProcessedAt)
	forgotten := op.Effects[3]
	require.Equal(t, "forgotten", forgotten.State)
	require.Empty(t, forgotten.ID)
	require.Nil(t, forgotten.PublishedAt)
}
