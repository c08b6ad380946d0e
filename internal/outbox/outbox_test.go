package outbox_test

import (
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
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

// Envelope appends its members by hand; the bytes are what marshaling
// CloudEvent deterministically gives, for tenants and data that need
// escaping, times in other zones, data given as a jsontext.Value, and an
// event type without a schema.
func TestEnvelopeIsTheMarshaledCloudEvent(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	for _, c := range []struct {
		name string
		e    outbox.Event
	}{
		{"note.created", outbox.Event{ID: uuid.New(), Tenant: "acme", AggregateID: uuid.New(), Type: contract.EventNoteCreated,
			Time: at, Data: map[string]any{"title": "<b>&\"x\"\u2028", "n": 1}}},
		{"data as a jsontext.Value", outbox.Event{ID: uuid.New(), Tenant: "t-1", AggregateID: uuid.New(), Type: contract.EventNoteUpdated,
			Time: at, Data: jsontext.Value(`{"id":"x","title":"é <>"}`)}},
		{"a tenant that needs escaping", outbox.Event{ID: uuid.New(), Tenant: "a\"b\\c</", AggregateID: uuid.New(), Type: contract.EventNoteDeleted,
			Time: time.Time{}, Data: nil}},
		{"an empty type, nil and max ids", outbox.Event{ID: uuid.Nil, Tenant: "acme", AggregateID: uuid.Max, Type: "",
			Time: at, Data: []int{1, 2}}},
	} {
		got, err := outbox.Envelope(c.e)
		require.NoError(t, err, c.name)
		data, ok := c.e.Data.(jsontext.Value)
		if !ok {
			data, err = json.Marshal(c.e.Data, json.Deterministic(true))
			require.NoError(t, err, c.name)
		}
		want, err := json.Marshal(outbox.CloudEvent{SpecVersion: "1.0", ID: c.e.ID.String(), Source: contract.Source(c.e.Tenant),
			Type: contract.CloudEventType(c.e.Type), Subject: c.e.AggregateID.String(), Time: c.e.Time.UTC().Format(outbox.TimeFormat),
			DataContentType: "application/json", DataSchema: contract.DataSchema(c.e.Type), Data: data}, json.Deterministic(true))
		require.NoError(t, err, c.name)
		require.Equal(t, string(want), string(got), c.name)
	}
	_, err := outbox.Envelope(outbox.Event{Tenant: "bad \xff utf-8", Type: contract.EventNoteCreated})
	require.Error(t, err, "invalid UTF-8 is refused as marshaling refuses it")
}

// AppendUUID writes what uuid.UUID.String gives.
func TestAppendUUID(t *testing.T) {
	t.Parallel()
	for _, u := range []uuid.UUID{uuid.Nil, uuid.Max, uuid.New(), uuid.MustParse("0123abcd-4567-89ef-fedc-ba9876543210")} {
		if got := string(outbox.AppendUUID([]byte("x"), u)); got != "x"+u.String() {
			t.Errorf("AppendUUID(%s) = %q", u, got)
		}
	}
}
