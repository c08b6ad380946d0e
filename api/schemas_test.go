package api_test

import (
	"fmt"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/eventschema"
)

// There is a schema for exactly the event types the code writes, each a
// 2020-12 schema of an object whose $id is the dataschema its events carry,
// and each compiles against the meta-schema.
func TestSchemas(t *testing.T) {
	t.Parallel()
	var want []string
	for _, typ := range []string{contract.EventAttachmentProcessed, contract.EventNoteCreated, contract.EventNoteDeleted, contract.EventNoteUpdated} {
		want = append(want, contract.CloudEventType(typ))
	}
	require.Equal(t, want, api.SchemaTypes())
	for _, typ := range []string{contract.EventAttachmentProcessed, contract.EventNoteCreated, contract.EventNoteDeleted, contract.EventNoteUpdated} {
		raw, err := api.Schema(contract.CloudEventType(typ))
		require.NoError(t, err, typ)
		var s struct {
			Schema               string   `json:"$schema"`
			ID                   string   `json:"$id"`
			Type                 string   `json:"type"`
			Required             []string `json:"required"`
			AdditionalProperties *bool    `json:"additionalProperties"`
		}
		require.NoError(t, json.Unmarshal(raw, &s, json.RejectUnknownMembers(false)), typ)
		require.Equal(t, "https://json-schema.org/draft/2020-12/schema", s.Schema, typ)
		require.Equal(t, contract.DataSchema(typ), s.ID, typ)
		require.Equal(t, "object", s.Type, typ)
		require.NotEmpty(t, s.Required, typ)
		// Open on purpose (decision 0051): a consumer holding this file
		// must not refuse an event that gained an optional member.
		require.NotNil(t, s.AdditionalProperties, "%s says additionalProperties explicitly", typ)
		require.True(t, *s.AdditionalProperties, typ)
	}
	_, err := eventschema.New()
	require.NoError(t, err)
}

func TestSchemaUnknown(t *testing.T) {
	t.Parallel()
	for _, typ := range []string{"", "quill.note.created.v2", "quill.note.created.v1.json", "note.created",
		"../openapi", "schemas/../../openapi", `..\x`, "/quill.note.created.v1", "quill.note.created.v1/"} {
		b, err := api.Schema(typ)
		require.ErrorIs(t, err, api.ErrUnknownSchema, "%q", typ)
		require.Nil(t, b)
	}
}

// Schema hands out a copy: changing it changes nothing served later.
func TestSchemaIsACopy(t *testing.T) {
	t.Parallel()
	a, err := api.Schema("quill.note.deleted.v1")
	require.NoError(t, err)
	a[0] = 'X'
	b, err := api.Schema("quill.note.deleted.v1")
	require.NoError(t, err)
	require.Equal(t, byte('{'), b[0])
}

func ExampleSchemaTypes() {
	for _, typ := range api.SchemaTypes() {
		fmt.Println("/schemas/" + typ + ".json")
	}
	fmt.Println(api.SchemaContentType)
	// Output:
	// /schemas/quill.attachment.processed.v1.json
	// /schemas/quill.note.created.v1.json
	// /schemas/quill.note.deleted.v1.json
	// /schemas/quill.note.updated.v1.json
	// application/schema+json
}
