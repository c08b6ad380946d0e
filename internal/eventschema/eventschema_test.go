package eventschema_test

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/eventschema"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/worker"
)

var (
	noteID  = uuid.MustParse("01a229cf-df18-7236-a349-3735bd4a95ce")
	attID   = uuid.MustParse("01a229cf-df18-7aaa-8bbb-3735bd4a95ce")
	eventID = uuid.MustParse("01a229cf-df18-7352-9441-e88e7d76d895")
	at      = time.Date(2026, 11, 30, 0, 16, 58, 648139000, time.UTC)
)

// The data the code writes, through the very types it writes them with:
// a renamed or retyped member of these types breaks a case below.
func createdData(withAttachment bool) notes.NoteView {
	n := notes.Note{ID: noteID, Tenant: "acme", Title: "Example <note> & \"quotes\"", Body: "body", CreatedAt: at, Version: 1, UpdatedAt: at}
	if withAttachment {
		n.Attachment = &notes.Attachment{ID: attID, NoteID: noteID, Filename: "a.png", ContentType: "image/png",
			Size: 42, SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", Status: notes.AttachmentPending}
	}
	return n.View()
}

func deletedData() notes.DeleteResult {
	return notes.DeleteResult{ID: noteID.String(), DeletedAt: notes.FormatTime(at)}
}

func processedData(state string) worker.ProcessedData {
	d := worker.ProcessedData{NoteID: noteID.String(), AttachmentID: attID.String(), State: state}
	if state == worker.StateProcessed {
		d.DetectedType = "image/png"
	} else {
		d.Reason = "corrupt: png: invalid format"
	}
	return d
}

// envelope returns the event of typ with data as the outbox writes it.
func envelope(t *testing.T, typ string, data any) []byte {
	t.Helper()
	b, err := outbox.Envelope(outbox.Event{ID: eventID, Tenant: "acme", AggregateID: noteID, Type: typ, Time: at, Data: data})
	require.NoError(t, err)
	return b
}

// asMap turns v into its JSON object, for a case to change.
func asMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// with returns a copy of m changed by f.
func with(m map[string]any, f func(map[string]any)) map[string]any {
	c := maps.Clone(m)
	if a, ok := c["attachment"].(map[string]any); ok {
		c["attachment"] = maps.Clone(a)
	}
	f(c)
	return c
}

// Each type's data as the code writes it passes; each change that breaks
// the schema is refused, and says where.
func TestData(t *testing.T) {
	t.Parallel()
	created := asMap(t, createdData(true))
	deleted := asMap(t, deletedData())
	updated := map[string]any{"id": noteID.String(), "version": 2, "title": "new", "updated_at": notes.FormatTime(at)}
	processed := asMap(t, processedData(worker.StateProcessed))
	failed := asMap(t, processedData(worker.StateFailed))
	att := func(f func(map[string]any)) func(map[string]any) {
		return func(m map[string]any) { f(m["attachment"].(map[string]any)) }
	}
	cases := []struct {
		name string
		typ  string
		data any
		// wantErr is empty for valid data, else a part of the error.
		wantErr string
	}{
		{"created", contract.EventNoteCreated, createdData(true), ""},
		{"created without attachment", contract.EventNoteCreated, createdData(false), ""},
		{"created empty body", contract.EventNoteCreated, with(created, func(m map[string]any) { m["body"] = "" }), ""},
		{"created missing body", contract.EventNoteCreated, with(created, func(m map[string]any) { delete(m, "body") }), "body"},
		{"created missing attachment", contract.EventNoteCreated, with(created, func(m map[string]any) { delete(m, "attachment") }), "attachment"},
		{"created empty title", contract.EventNoteCreated, with(created, func(m map[string]any) { m["title"] = "" }), "/title"},
		{"created control in title", contract.EventNoteCreated, with(created, func(m map[string]any) { m["title"] = "a\u0007b" }), "/title"},
		{"created title a number", contract.EventNoteCreated, with(created, func(m map[string]any) { m["title"] = 7 }), "/title"},
		{"created id not a uuid", contract.EventNoteCreated, with(created, func(m map[string]any) { m["id"] = "note-1" }), "/id"},
		{"created id upper case", contract.EventNoteCreated, with(created, func(m map[string]any) { m["id"] = "01A229CF-DF18-7236-A349-3735BD4A95CE" }), "/id"},
		{"created_at not a date-time", contract.EventNoteCreated, with(created, func(m map[string]any) { m["created_at"] = "yesterday" }), "/created_at"},
		{"created_at without microseconds", contract.EventNoteCreated, with(created, func(m map[string]any) { m["created_at"] = "2026-11-30T00:16:58Z" }), "/created_at"},
		{"created attachment processed", contract.EventNoteCreated, with(created, att(func(a map[string]any) { a["status"] = "processed" })), "/attachment"},
		{"created attachment negative size", contract.EventNoteCreated, with(created, att(func(a map[string]any) { a["size"] = -1 })), "/attachment"},
		{"created attachment size a string", contract.EventNoteCreated, with(created, att(func(a map[string]any) { a["size"] = "42" })), "/attachment"},
		{"created attachment bad sha256", contract.EventNoteCreated, with(created, att(func(a map[string]any) { a["sha256"] = "abc" })), "/attachment"},
		{"created attachment missing filename", contract.EventNoteCreated, with(created, att(func(a map[string]any) { delete(a, "filename") })), "/attachment"},
		{"created undeclared member", contract.EventNoteCreated, with(created, func(m map[string]any) { m["colour"] = "red" }), "does not declare"},
		{"created attachment undeclared member", contract.EventNoteCreated, with(created, att(func(a map[string]any) { a["data"] = "AAAA" })), "does not declare"},
		{"created data an array", contract.EventNoteCreated, []any{created}, "want object"},

		{"deleted", contract.EventNoteDeleted, deletedData(), ""},
		{"deleted missing deleted_at", contract.EventNoteDeleted, with(deleted, func(m map[string]any) { delete(m, "deleted_at") }), "deleted_at"},
		{"deleted deleted_at not a date-time", contract.EventNoteDeleted, with(deleted, func(m map[string]any) { m["deleted_at"] = "2026-13-30T00:16:58.648139Z" }), "/deleted_at"},
		{"deleted id renamed", contract.EventNoteDeleted, with(deleted, func(m map[string]any) { m["note_id"] = m["id"]; delete(m, "id") }), "id"},
		{"deleted undeclared member", contract.EventNoteDeleted, with(deleted, func(m map[string]any) { m["title"] = "t" }), "does not declare"},

		{"created version 2", contract.EventNoteCreated, with(created, func(m map[string]any) { m["version"] = 2 }), "/version"},
		{"created before versions", contract.EventNoteCreated, with(created, func(m map[string]any) { delete(m, "version"); delete(m, "updated_at") }), ""},
		{"updated", contract.EventNoteUpdated, updated, ""},
		{"updated body emptied", contract.EventNoteUpdated, with(updated, func(m map[string]any) { delete(m, "title"); m["body"] = "" }), ""},
		{"updated missing version", contract.EventNoteUpdated, with(updated, func(m map[string]any) { delete(m, "version") }), "version"},
		{"updated version 1", contract.EventNoteUpdated, with(updated, func(m map[string]any) { m["version"] = 1 }), "/version"},
		{"updated empty title", contract.EventNoteUpdated, with(updated, func(m map[string]any) { m["title"] = "" }), "/title"},
		{"updated undeclared member", contract.EventNoteUpdated, with(updated, func(m map[string]any) { m["colour"] = "red" }), "does not declare"},
		{"deleted with version", contract.EventNoteDeleted, with(deleted, func(m map[string]any) { m["version"] = 3 }), ""},

		{"processed", contract.EventAttachmentProcessed, processedData(worker.StateProcessed), ""},
		{"failed", contract.EventAttachmentProcessed, processedData(worker.StateFailed), ""},
		{"processed unknown state", contract.EventAttachmentProcessed, with(processed, func(m map[string]any) { m["state"] = "done" }), "/state"},
		{"processed without detected_type", contract.EventAttachmentProcessed, with(processed, func(m map[string]any) { delete(m, "detected_type") }), "detected_type"},
		{"processed with a reason", contract.EventAttachmentProcessed, with(processed, func(m map[string]any) { m["reason"] = "r" }), "reason"},
		{"failed without reason", contract.EventAttachmentProcessed, with(failed, func(m map[string]any) { delete(m, "reason") }), "reason"},
		{"failed with detected_type", contract.EventAttachmentProcessed, with(failed, func(m map[string]any) { m["detected_type"] = "image/png" }), "detected_type"},
		{"processed missing note_id", contract.EventAttachmentProcessed, with(processed, func(m map[string]any) { delete(m, "note_id") }), "note_id"},
		{"processed attachment_id not a uuid", contract.EventAttachmentProcessed, with(processed, func(m map[string]any) { m["attachment_id"] = 1 }), "/attachment_id"},
		{"processed undeclared member", contract.EventAttachmentProcessed, with(processed, func(m map[string]any) { m["thumbnail"] = "AAAA" }), "does not declare"},
	}
	v, err := eventschema.New()
	require.NoError(t, err)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := v.Validate(envelope(t, c.typ, c.data))
			if c.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, eventschema.ErrInvalid)
			require.ErrorContains(t, err, c.wantErr)
		})
	}
}

// The envelope around valid data: Quill's attributes and nothing else,
// and a dataschema naming the type's schema.
func TestEnvelope(t *testing.T) {
	t.Parallel()
	good := asMapBytes(t, envelope(t, contract.EventNoteDeleted, deletedData()))
	cases := []struct {
		name    string
		change  func(map[string]any)
		wantErr string
	}{
		{"as written", func(map[string]any) {}, ""},
		{"no dataschema", func(m map[string]any) { delete(m, "dataschema") }, "dataschema"},
		{"dataschema of another type", func(m map[string]any) { m["dataschema"] = contract.DataSchema(contract.EventNoteCreated) }, "dataschema"},
		{"dataschema a URL", func(m map[string]any) { m["dataschema"] = "https://quill.example/schemas/quill.note.deleted.v1.json" }, "dataschema"},
		{"unknown type", func(m map[string]any) { m["type"] = "quill.note.deleted.v2" }, "no schema"},
		{"specversion", func(m map[string]any) { m["specversion"] = "0.3" }, "specversion"},
		{"id not a uuid", func(m map[string]any) { m["id"] = "e1" }, "id"},
		{"source", func(m map[string]any) { m["source"] = "/tenants/Acme" }, "source"},
		{"subject", func(m map[string]any) { m["subject"] = "" }, "subject"},
		{"time with an offset", func(m map[string]any) { m["time"] = "2026-11-30T01:16:58.648139+01:00" }, "time"},
		{"datacontenttype", func(m map[string]any) { m["datacontenttype"] = "text/plain" }, "datacontenttype"},
		{"no data", func(m map[string]any) { delete(m, "data") }, "no data"},
		{"an extension Quill does not write", func(m map[string]any) { m["partitionkey"] = "x" }, "not a Quill CloudEvent"},
	}
	v, err := eventschema.New()
	require.NoError(t, err)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := maps.Clone(good)
			c.change(m)
			b, err := json.Marshal(m)
			require.NoError(t, err)
			err = v.Validate(b)
			if c.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, eventschema.ErrInvalid)
			require.ErrorContains(t, err, c.wantErr)
		})
	}
	for _, bad := range []string{"", "{not json", "null", "[]", `{"specversion":"1.0","specversion":"1.0"}`} {
		require.ErrorIs(t, v.Validate([]byte(bad)), eventschema.ErrInvalid, "%q", bad)
	}
}

func asMapBytes(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// The package-level Validate is New's validator.
func TestValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, eventschema.Validate(envelope(t, contract.EventAttachmentProcessed, processedData(worker.StateFailed))))
	err := eventschema.Validate(envelope(t, contract.EventAttachmentProcessed, map[string]any{"state": "failed"}))
	require.True(t, errors.Is(err, eventschema.ErrInvalid), "%v", err)
}

func ExampleValidate() {
	ev, _ := outbox.Envelope(outbox.Event{ID: eventID, Tenant: "acme", AggregateID: noteID,
		Type: contract.EventNoteDeleted, Time: at, Data: map[string]any{"id": noteID.String()}})
	fmt.Println(eventschema.Validate(ev) != nil)
	// Output:
	// true
}
