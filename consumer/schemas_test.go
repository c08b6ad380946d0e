package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
)

func TestSchemaValidator(t *testing.T) {
	t.Parallel()
	validate, err := consumer.SchemaValidator()
	require.NoError(t, err)
	note := uuid.NewString()
	deleted := func(data, schema string) consumer.Event {
		return consumer.Event{Type: "quill.note.deleted.v1", DataSchema: schema, Data: []byte(data)}
	}
	ok := `{"id":"` + note + `","deleted_at":"2026-12-01T10:00:00.000000Z"}`
	for _, tc := range []struct {
		name string
		ev   consumer.Event
		want string // "" for valid
	}{
		{"valid", deleted(ok, contract.DataSchemaPrefix+"quill.note.deleted.v1"), ""},
		{"valid without dataschema", deleted(ok, ""), ""},
		{"an unknown member is allowed", deleted(`{"id":"`+note+`","deleted_at":"2026-12-01T10:00:00.000000Z","reason":"x"}`, ""), ""},
		{"missing member", deleted(`{"id":"`+note+`"}`, ""), "deleted_at"},
		{"wrong type of member", deleted(`{"id":7,"deleted_at":"2026-12-01T10:00:00.000000Z"}`, ""), "id"},
		{"bad time", deleted(`{"id":"`+note+`","deleted_at":"yesterday"}`, ""), "deleted_at"},
		{"not JSON", deleted(`{`, ""), "not JSON"},
		{"another schema", deleted(ok, contract.DataSchemaPrefix+"quill.note.created.v1"), "dataschema"},
		{"a type of a newer release passes", consumer.Event{Type: "quill.note.moved.v1", Data: []byte(`{}`)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := validate(tc.ev)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, consumer.ErrSchema)
			require.ErrorContains(t, err, tc.want)
		})
	}
	// Every type Quill publishes has its schema checked.
	for _, typ := range contract.SchemaTypes() {
		require.ErrorIs(t, validate(consumer.Event{Type: typ, Data: []byte(`{}`)}), consumer.ErrSchema, typ)
	}
}

// A message whose data breaks its schema is a dead letter naming the
// member, and the next message is processed.
func TestEventBreakingItsSchemaIsADeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	validate, err := consumer.SchemaValidator()
	require.NoError(t, err)
	cfg.Validate = validate
	var calls atomic.Int32
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		calls.Add(1)
		return record(ctx, tx, ev)
	})
	note := uuid.NewString()
	bad := b.event(uuid.NewString(), note, "quill.note.deleted.v1") // data {"id": note}: no deleted_at
	b.publish("quill."+b.tenant+".note.deleted", "bad", bad)
	good := uuid.NewString()
	b.publish("quill."+b.tenant+".note.deleted", good, []byte(`{"specversion":"1.0","id":"`+good+`","source":"/tenants/`+b.tenant+
		`","type":"quill.note.deleted.v1","subject":"`+note+`","time":"2026-12-01T10:00:00.000000Z","datacontenttype":"application/json",`+
		`"data":{"id":"`+note+`","deleted_at":"2026-12-01T10:00:00.000000Z"}}`))
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	b.settled(cfg.Durable)
	dl := b.deadLetters()
	require.Len(t, dl, 1)
	require.Contains(t, dl[0].Reason, "deleted_at")
	require.True(t, errors.Is(validate(consumer.Event{Type: "quill.note.deleted.v1", Data: []byte(`{}`)}), consumer.ErrSchema))
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, 1, b.count(`SELECT count(*) FROM effects WHERE event_id = $1`, good))
}
