package outbox_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/eventschema"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/testkit"
)

func TestEnvelopeIsCloudEventsStructuredJSON(t *testing.T) {
	t.Parallel()
	e := outbox.Event{
		ID:          uuid.MustParse("01a229cf-df18-7352-9441-e88e7d76d895"),
		Tenant:      "acme",
		AggregateID: uuid.MustParse("01a229cf-df18-7236-a349-3735bd4a95ce"),
		Type:        contract.EventNoteCreated,
		Time:        time.Date(2026, 11, 30, 0, 16, 58, 648139000, time.UTC),
		Data: map[string]any{"id": "01a229cf-df18-7236-a349-3735bd4a95ce", "title": "Example <note> & \"quotes\"",
			"body": "", "created_at": "2026-11-30T00:16:58.648139Z", "attachment": nil},
	}
	got, err := outbox.Envelope(e)
	require.NoError(t, err)
	testkit.Golden(t, "note_created.json", got)
	require.NoError(t, eventschema.Validate(got))
	require.Equal(t, "urn:quill:schema:quill.note.created.v1", contract.DataSchema(contract.EventNoteCreated))
	require.Equal(t, "quill.attachment.processed.v1", contract.CloudEventType(contract.EventAttachmentProcessed))
}
