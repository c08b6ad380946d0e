package outbox_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/outbox"
)

// What Quill's outbox writes, on the subject the relay publishes it to,
// parses with the public consumer module: the package and the writer agree
// on the form. (Here, in the server's module: the consumer's module cannot
// import the outbox.)
func TestTheConsumerParsesWhatTheOutboxWrites(t *testing.T) {
	t.Parallel()
	note := uuid.New()
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456000, time.UTC)
	for _, typ := range []string{contract.EventNoteCreated, contract.EventNoteDeleted, contract.EventAttachmentProcessed} {
		id := uuid.New()
		payload, err := outbox.Envelope(outbox.Event{ID: id, Tenant: "acme-1", AggregateID: note, Type: typ, Time: at,
			Data: map[string]string{"id": note.String()}})
		require.NoError(t, err)
		ev, err := consumer.ParseEvent(payload, contract.Subject("quill", "acme-1", typ))
		require.NoError(t, err, typ)
		require.Equal(t, id.String(), ev.ID)
		require.Equal(t, contract.CloudEventType(typ), ev.Type)
		require.Equal(t, "acme-1", ev.Tenant)
		require.Equal(t, note.String(), ev.Subject)
		require.Equal(t, at, ev.Time)
		require.JSONEq(t, `{"id":"`+note.String()+`"}`, string(ev.Data))
	}
}
