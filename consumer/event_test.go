package consumer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
)

func TestParseEvent(t *testing.T) {
	t.Parallel()
	const id = "01a229cf-df18-7352-9441-e88e7d76d895"
	const note = "01a229cf-df18-7236-a349-3735bd4a95ce"
	good := `{"specversion":"1.0","id":"` + id + `","source":"/tenants/acme","type":"quill.note.created.v1","subject":"` + note +
		`","time":"2026-11-30T00:16:58.648139Z","datacontenttype":"application/json","data":{"id":"` + note + `"},"extension":"kept"}`
	ev, err := consumer.ParseEvent([]byte(good), "quill.acme.note.created")
	require.NoError(t, err)
	require.Equal(t, consumer.Event{ID: id, Type: "quill.note.created.v1", Source: "/tenants/acme", Tenant: "acme", Subject: note,
		Time: time.Date(2026, 11, 30, 0, 16, 58, 648139000, time.UTC), DataContentType: "application/json",
		Data: []byte(`{"id":"` + note + `"}`), Payload: []byte(good)}, ev)

	for _, tc := range []struct {
		name, payload, subject, reason string
	}{
		{"not JSON", `not json`, "", "unparseable event: "},
		{"not an object", `[1]`, "", "unparseable event: "},
		{"duplicate member", `{"id":"a","id":"b"}`, "", "unparseable event: "},
		{"no specversion", `{"id":"` + id + `"}`, "", `event specversion "" is not 1.0`},
		{"no id", `{"specversion":"1.0"}`, "", "event has no id"},
		{"no source", `{"specversion":"1.0","id":"` + id + `"}`, "", "event has no source"},
		{"no type", `{"specversion":"1.0","id":"` + id + `","source":"/tenants/acme"}`, "", "event has no type"},
		{"no subject", `{"specversion":"1.0","id":"` + id + `","source":"/tenants/acme","type":"quill.note.created.v1"}`, "", "event has no subject"},
		{"no time", `{"specversion":"1.0","id":"` + id + `","source":"/tenants/acme","type":"quill.note.created.v1","subject":"n"}`, "", "event has no time"},
		{"no data", `{"specversion":"1.0","id":"` + id + `","source":"/tenants/acme","type":"quill.note.created.v1","subject":"n","time":"2026-11-30T00:16:58Z"}`, "", "event has no data"},
		{"id not a UUID", `{"specversion":"1.0","id":"42","source":"/tenants/acme","type":"quill.note.created.v1","subject":"n","time":"2026-11-30T00:16:58Z","data":{}}`, "", `event id "42" is not a UUID`},
		{"id in braces", `{"specversion":"1.0","id":"{` + id + `}","source":"/tenants/acme","type":"quill.note.created.v1","subject":"n","time":"2026-11-30T00:16:58Z","data":{}}`, "", "is not a UUID"},
		{"source no tenant", `{"specversion":"1.0","id":"` + id + `","source":"/acme","type":"quill.note.created.v1","subject":"n","time":"2026-11-30T00:16:58Z","data":{}}`, "", `event source "/acme" is not /tenants/<tenant>`},
		{"bad tenant", `{"specversion":"1.0","id":"` + id + `","source":"/tenants/Acme","type":"quill.note.created.v1","subject":"n","time":"2026-11-30T00:16:58Z","data":{}}`, "", "is not /tenants/<tenant>"},
		{"foreign type", `{"specversion":"1.0","id":"` + id + `","source":"/tenants/acme","type":"com.example.thing","subject":"n","time":"2026-11-30T00:16:58Z","data":{}}`, "", `event type "com.example.thing" is not quill.<aggregate>.<event>.v<N>`},
		{"bad time", `{"specversion":"1.0","id":"` + id + `","source":"/tenants/acme","type":"quill.note.created.v1","subject":"n","time":"yesterday","data":{}}`, "", `event time "yesterday" is not RFC 3339`},
		{"other tenant's subject", good, "quill.other.note.created", `event of tenant "acme" and type "quill.note.created.v1" delivered on subject "quill.other.note.created"`},
		{"other type's subject", good, "quill.acme.note.deleted", `delivered on subject "quill.acme.note.deleted"`},
		{"subject of another form", good, "quill.acme.note", `delivered on subject "quill.acme.note"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := consumer.ParseEvent([]byte(tc.payload), tc.subject)
			var inv *consumer.InvalidEventError
			require.True(t, errors.As(err, &inv), "%v", err)
			require.Contains(t, inv.Reason, tc.reason)
			require.True(t, consumer.IsPermanent(err))
		})
	}
}

func TestPermanent(t *testing.T) {
	t.Parallel()
	require.NoError(t, consumer.Permanent(nil))
	base := errors.New("x")
	err := consumer.Permanent(base)
	require.ErrorIs(t, err, base)
	require.True(t, consumer.IsPermanent(err))
	require.True(t, consumer.IsPermanent(errors.Join(errors.New("y"), err)))
	require.False(t, consumer.IsPermanent(base))
}

// Version reads a note event's data.version; an event of another
// aggregate, one written before Quill versioned notes and one whose
// version is not a positive integer carry none.
func TestEventVersion(t *testing.T) {
	t.Parallel()
	const note = "01a229cf-df18-7236-a349-3735bd4a95ce"
	created := contract.CloudEventType(contract.EventNoteCreated)
	updated := contract.CloudEventType(contract.EventNoteUpdated)
	deleted := contract.CloudEventType(contract.EventNoteDeleted)
	processed := contract.CloudEventType(contract.EventAttachmentProcessed)
	for _, tc := range []struct {
		name, typ, data string
		want            int64
		ok              bool
	}{
		{"created", created, `{"id":"` + note + `","title":"t","body":"","created_at":"2026-12-01T10:00:00.000000Z","attachment":null,"version":1,"updated_at":"2026-12-01T10:00:00.000000Z"}`, 1, true},
		{"updated", updated, `{"id":"` + note + `","version":7,"title":"t","updated_at":"2026-12-01T10:00:00.000000Z"}`, 7, true},
		{"deleted", deleted, `{"id":"` + note + `","deleted_at":"2026-12-01T10:00:00.000000Z","version":3}`, 3, true},
		{"version first, large", updated, `{"version":9007199254740993,"id":"` + note + `"}`, 9007199254740993, true},
		{"created before versioning", created, `{"id":"` + note + `","title":"t","body":"","created_at":"2026-12-01T10:00:00.000000Z","attachment":null}`, 0, false},
		{"deleted before versioning", deleted, `{"id":"` + note + `","deleted_at":"2026-12-01T10:00:00.000000Z"}`, 0, false},
		{"attachment.processed", processed, `{"note_id":"` + note + `","attachment_id":"` + note + `","state":"processed","version":4}`, 0, false},
		{"another aggregate", "quill.tag.created.v1", `{"version":2}`, 0, false},
		{"a type this build does not know", "quill.note.updated.v2", `{"version":2}`, 0, false},
		{"a member named version inside another", updated, `{"id":"` + note + `","title":{"version":2}}`, 0, false},
		{"zero", updated, `{"version":0}`, 0, false},
		{"negative", updated, `{"version":-2}`, 0, false},
		{"fraction", updated, `{"version":2.5}`, 0, false},
		{"exponent", updated, `{"version":2e0}`, 0, false},
		{"a string", updated, `{"version":"2"}`, 0, false},
		{"null", updated, `{"version":null}`, 0, false},
		{"beyond int64", updated, `{"version":9223372036854775808}`, 0, false},
		{"data not an object", updated, `[{"version":2}]`, 0, false},
		{"data not JSON", updated, `{"version":`, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, ok := consumer.Event{Type: tc.typ, Subject: note, Data: []byte(tc.data)}.Version()
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, v)
		})
	}
}
