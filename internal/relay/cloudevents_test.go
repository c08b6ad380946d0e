package relay_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/eventschema"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/worker"
)

// A consumer written with the CloudEvents Go SDK reads the stream's
// messages as the relay publishes them: the SDK recognises structured
// content mode from the Content-Type header, decodes each event, finds it
// valid, and gets every attribute and the data back as Quill wrote them.
// The events are the real ones: a create with an attachment and a delete
// through the notes service, and an attachment.processed written as the
// attachment worker writes it; the real relay publishes them.
func TestCloudEventsSDKReadsEveryAttribute(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r, _ := h.newRelay(h.config(), h.relayID("ce"))
	start(t, r)
	ctx := h.ctx()

	svc, notifier := h.notifyingNotes(ctx)

	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	png := []byte("\x89PNG\r\n\x1a\n not really")
	sum := sha256.Sum256(png)
	created, err := svc.Create(ctx, notes.Request{Tenant: h.tenant, Key: "ce-create", Wait: -1, Traceparent: traceparent, Render: httpapi.RenderWrite},
		notes.CreateParams{Title: "Meeting notes", Body: "Ship on Friday.",
			Attachment: &notes.NewAttachment{Filename: "board.png", ContentType: "image/png", Data: png, SHA256: hex.EncodeToString(sum[:])}})
	require.NoError(t, err)
	require.Equal(t, notes.OutcomeCreated, created.Outcome, "%s", created.Body)
	noteID := uuid.MustParse(strings.TrimPrefix(created.Resource, "/v1/notes/"))
	var note struct {
		Attachment struct {
			ID string `json:"id"`
		} `json:"attachment"`
	}
	require.NoError(t, json.Unmarshal(created.Body, &note))

	// attachment.processed, as the worker's commit queues it: its id derived
	// from the note.created event's.
	var createdEvent uuid.UUID
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT id FROM outbox_events WHERE aggregate_id = $1 AND type = $2`,
		noteID, contract.EventNoteCreated).Scan(&createdEvent))
	processed := worker.ProcessedData{NoteID: noteID.String(), AttachmentID: note.Attachment.ID, State: worker.StateFailed, Reason: "the PNG is corrupt"}
	e := outbox.Event{ID: notes.ProcessedEventID(createdEvent), Tenant: h.tenant, AggregateID: noteID,
		Type: contract.EventAttachmentProcessed, Time: time.Now().UTC().Truncate(time.Microsecond), Data: processed}
	require.NoError(t, db.WithTx(ctx, h.pool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }))
	notifier.Signal()
	processedData, err := json.Marshal(processed)
	require.NoError(t, err)

	deleted, err := svc.Delete(ctx, notes.Request{Tenant: h.tenant, Key: "ce-delete", Wait: -1, Render: httpapi.RenderWrite}, noteID)
	require.NoError(t, err)
	require.Equal(t, notes.OutcomeDeleted, deleted.Outcome, "%s", deleted.Body)

	h.waitPublished(3)
	msgs := h.requireExactlyOnce(3)
	wantData := map[string][]byte{
		contract.EventNoteCreated:         created.Body, // the note as the API answered the create
		contract.EventAttachmentProcessed: processedData,
		// The delete's answer and the version the delete made.
		contract.EventNoteDeleted: append(bytes.TrimSuffix(bytes.Clone(deleted.Body), []byte("}")), `,"version":2}`...),
	}
	headers := documentedHeaders(t)
	schemas, err := eventschema.New()
	require.NoError(t, err)

	var types []string
	for _, m := range msgs {
		row := h.outboxEvent(uuid.MustParse(m.Header.Get(jetstream.MsgIDHeader)))
		types = append(types, row.typ)
		for name := range m.Header {
			require.Contains(t, headers, name, "header %s of the message is in api/asyncapi.yaml", name)
		}
		if row.typ == contract.EventNoteCreated {
			require.Equal(t, traceparent, m.Header.Get("traceparent"), "the request's traceparent travels as a header")
		}

		// The SDK's own reading of a message: its encoding from the
		// headers, then the event. NATS headers have HTTP's form, so the
		// SDK's HTTP binding reads them as they are.
		msg := cehttp.NewMessage(http.Header(m.Header), io.NopCloser(bytes.NewReader(m.Data)))
		require.Equal(t, binding.EncodingStructured, msg.ReadEncoding(), "Content-Type selects structured mode")
		ev, err := binding.ToEvent(ctx, msg)
		require.NoError(t, err, "message %d", m.Sequence)
		require.NoError(t, ev.Validate())
		require.NotNil(t, format.Lookup(m.Header.Get("Content-Type")), "the SDK knows the content type as a format")

		require.Equal(t, cloudevents.VersionV1, ev.SpecVersion())
		require.Equal(t, row.id.String(), ev.ID(), "id is the event id")
		require.Equal(t, "/tenants/"+h.tenant, ev.Source())
		require.Equal(t, contract.CloudEventType(row.typ), ev.Type())
		require.Equal(t, row.aggregate.String(), ev.Subject(), "subject is the note id")
		require.True(t, row.createdAt.Equal(ev.Time()), "time %s, the event's %s", ev.Time(), row.createdAt)
		require.Equal(t, "application/json", ev.DataContentType())
		require.Equal(t, contract.DataSchema(row.typ), ev.DataSchema())
		require.Empty(t, ev.Extensions(), "no attribute beyond the spec's")
		require.JSONEq(t, string(wantData[row.typ]), string(ev.Data()), "data of %s", row.typ)
		var typed map[string]any
		require.NoError(t, ev.DataAs(&typed), "the SDK decodes data by its datacontenttype")
		require.NotEmpty(t, typed)
		require.Equal(t, contract.Subject(h.prefix, h.tenant, row.typ), m.Subject)

		// Nothing is lost: the SDK writes back every member Quill wrote.
		back, err := format.JSON.Marshal(ev)
		require.NoError(t, err)
		require.Equal(t, jsonKeys(t, m.Data), jsonKeys(t, back))
		require.NoError(t, schemas.Validate(m.Data), "message %d against its schema", m.Sequence)
	}
	require.Equal(t, []string{contract.EventNoteCreated, contract.EventAttachmentProcessed, contract.EventNoteDeleted}, types,
		"the note's events in commit order")
}

type outboxEvent struct {
	id, aggregate uuid.UUID
	typ           string
	createdAt     time.Time
}

func (h *harness) outboxEvent(id uuid.UUID) outboxEvent {
	h.t.Helper()
	e := outboxEvent{id: id}
	require.NoError(h.t, h.pool.QueryRow(h.ctx(), `SELECT aggregate_id, type, created_at FROM outbox_events WHERE id = $1`, id).
		Scan(&e.aggregate, &e.typ, &e.createdAt))
	return e
}

// documentedHeaders returns the message headers api/asyncapi.yaml
// describes.
func documentedHeaders(t *testing.T) []string {
	t.Helper()
	var doc struct {
		Components struct {
			Schemas struct {
				Headers struct {
					Properties map[string]any `yaml:"properties"`
				} `yaml:"Headers"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(api.AsyncAPI(), &doc))
	names := slices.Sorted(maps.Keys(doc.Components.Schemas.Headers.Properties))
	require.NotEmpty(t, names)
	return names
}

func jsonKeys(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &m))
	return slices.Sorted(maps.Keys(m))
}
