package projection_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/examples/notesearch/projection"
	"github.com/quillhq/quill/internal/dbtest"
)

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dbtest.EmptySchema(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, projection.Migrate(t.Context(), pool))
	require.NoError(t, projection.Migrate(t.Context(), pool), "a second start finds the table")
	return pool
}

const (
	createdAt = "2026-12-01T10:00:00.000001Z"
	deletedAt = "2026-12-01T11:00:00.000002Z"
	updatedAt = "2026-12-01T10:30:00.000003Z"
)

func created(note, title, body string) consumer.Event {
	return consumer.Event{ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteCreated), Tenant: "acme", Subject: note,
		Data: fmt.Appendf(nil, `{"id":%q,"title":%q,"body":%q,"created_at":%q,"attachment":null}`, note, title, body, createdAt)}
}

func deleted(note string) consumer.Event {
	return consumer.Event{ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteDeleted), Tenant: "acme", Subject: note,
		Data: fmt.Appendf(nil, `{"id":%q,"deleted_at":%q}`, note, deletedAt)}
}

// The versioned events, as Quill writes them since it versions notes.
func createdV(note, title, body string) consumer.Event {
	ev := created(note, title, body)
	ev.Data = fmt.Appendf(nil, `{"id":%q,"title":%q,"body":%q,"created_at":%q,"attachment":null,"version":1,"updated_at":%q}`,
		note, title, body, createdAt, createdAt)
	return ev
}

// updated is a note.updated of version v changing the fields given.
func updated(note string, v int64, title, body *string) consumer.Event {
	data := fmt.Sprintf(`{"id":%q,"version":%d,"updated_at":%q`, note, v, updatedAt)
	if title != nil {
		data += fmt.Sprintf(`,"title":%q`, *title)
	}
	if body != nil {
		data += fmt.Sprintf(`,"body":%q`, *body)
	}
	return consumer.Event{ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteUpdated), Tenant: "acme", Subject: note,
		Data: []byte(data + "}")}
}

func deletedV(note string, v int64) consumer.Event {
	ev := deleted(note)
	ev.Data = fmt.Appendf(nil, `{"id":%q,"deleted_at":%q,"version":%d}`, note, deletedAt, v)
	return ev
}

func apply(ctx context.Context, pool *pgxpool.Pool, ev consumer.Event) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return projection.Apply(ctx, tx, ev) })
}

func ptr[T any](v T) *T { return &v }

func mustTime(s string) *time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return &t
}

// TestApply applies sequences of one note's events and checks its row:
// a create makes it searchable, a delete leaves a tombstone whichever
// arrives first.
func TestApply(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	for _, tc := range []struct {
		name   string
		events func(note string) []consumer.Event
		want   *projection.Note // nil: no row
	}{
		{
			name:   "create",
			events: func(n string) []consumer.Event { return []consumer.Event{created(n, "Groceries", "milk, é")} },
			want:   &projection.Note{Title: ptr("Groceries"), BodyLength: ptr(7), CreatedAt: mustTime(createdAt), CreatedApplied: 1},
		},
		{
			name:   "create then delete",
			events: func(n string) []consumer.Event { return []consumer.Event{created(n, "Groceries", "milk"), deleted(n)} },
			want:   &projection.Note{CreatedAt: mustTime(createdAt), DeletedAt: mustTime(deletedAt), CreatedApplied: 1, DeletedApplied: 1},
		},
		{
			name:   "delete before its create: the tombstone stays",
			events: func(n string) []consumer.Event { return []consumer.Event{deleted(n), created(n, "Groceries", "milk")} },
			want:   &projection.Note{CreatedAt: mustTime(createdAt), DeletedAt: mustTime(deletedAt), CreatedApplied: 1, DeletedApplied: 1},
		},
		{
			name:   "delete alone",
			events: func(n string) []consumer.Event { return []consumer.Event{deleted(n)} },
			want:   &projection.Note{DeletedAt: mustTime(deletedAt), DeletedApplied: 1},
		},
		{
			name: "create and updates: each changes only its fields",
			events: func(n string) []consumer.Event {
				return []consumer.Event{createdV(n, "Groceries", "milk"), updated(n, 2, ptr("Shopping"), nil), updated(n, 3, nil, ptr("milk, eggs"))}
			},
			want: &projection.Note{Title: ptr("Shopping"), BodyLength: ptr(10), CreatedAt: mustTime(createdAt), Version: ptr[int64](3),
				CreatedApplied: 1, UpdatedApplied: 2},
		},
		{
			name: "an update that changes both",
			events: func(n string) []consumer.Event {
				return []consumer.Event{createdV(n, "Groceries", "milk"), updated(n, 2, ptr("Shopping"), ptr(""))}
			},
			want: &projection.Note{Title: ptr("Shopping"), BodyLength: ptr(0), CreatedAt: mustTime(createdAt), Version: ptr[int64](2),
				CreatedApplied: 1, UpdatedApplied: 1},
		},
		{
			name:   "an update without its create (started late): what it knows",
			events: func(n string) []consumer.Event { return []consumer.Event{updated(n, 5, ptr("Later"), nil)} },
			want:   &projection.Note{Title: ptr("Later"), Version: ptr[int64](5), UpdatedApplied: 1},
		},
		{
			name: "an update of a tombstone changes nothing",
			events: func(n string) []consumer.Event {
				return []consumer.Event{createdV(n, "Groceries", "milk"), deletedV(n, 2), updated(n, 2, ptr("Back"), nil)}
			},
			want: &projection.Note{CreatedAt: mustTime(createdAt), DeletedAt: mustTime(deletedAt), Version: ptr[int64](2),
				CreatedApplied: 1, UpdatedApplied: 1, DeletedApplied: 1},
		},
		{
			name: "a type the projection does not use",
			events: func(n string) []consumer.Event {
				return []consumer.Event{{ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventAttachmentProcessed), Tenant: "acme", Subject: n, Data: []byte(`{}`)}}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			note := uuid.NewString()
			for _, ev := range tc.events(note) {
				require.NoError(t, apply(t.Context(), pool, ev))
			}
			all, err := projection.List(t.Context(), pool)
			require.NoError(t, err)
			var got *projection.Note
			for _, n := range all {
				if n.ID == note {
					got = &n
				}
			}
			if tc.want == nil {
				assert.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			tc.want.Tenant, tc.want.ID = "acme", note
			for _, p := range []**time.Time{&got.CreatedAt, &got.DeletedAt} {
				if *p != nil {
					*p = ptr((*p).UTC())
				}
			}
			assert.Equal(t, *tc.want, *got)
			assert.Equal(t, tc.want.DeletedAt != nil, got.Deleted())
		})
	}
}

// TestApplyRefusesWhatNoRedeliveryCures checks that an event the projection
// can never apply is a Permanent error (a dead letter) and writes nothing.
func TestApplyRefusesWhatNoRedeliveryCures(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	note := uuid.NewString()
	other := created(uuid.NewString(), "x", "")
	other.Subject = note
	notUUID := created("not-a-uuid", "x", "")
	for name, ev := range map[string]consumer.Event{
		"data not JSON":             {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteCreated), Tenant: "acme", Subject: note, Data: []byte(`{`)},
		"data of the wrong shape":   {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteDeleted), Tenant: "acme", Subject: note, Data: []byte(`{"id":1}`)},
		"data names another note":   other,
		"subject is not a note id":  notUUID,
		"deleted_at is not a time":  {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteDeleted), Tenant: "acme", Subject: note, Data: fmt.Appendf(nil, `{"id":%q,"deleted_at":"yesterday"}`, note)},
		"no deleted_at":             {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteDeleted), Tenant: "acme", Subject: note, Data: fmt.Appendf(nil, `{"id":%q}`, note)},
		"no created_at":             {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteCreated), Tenant: "acme", Subject: note, Data: fmt.Appendf(nil, `{"id":%q,"title":"t"}`, note)},
		"created_at is not a time":  {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteCreated), Tenant: "acme", Subject: note, Data: fmt.Appendf(nil, `{"id":%q,"title":"t","created_at":"now"}`, note)},
		"update without updated_at": {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteUpdated), Tenant: "acme", Subject: note, Data: fmt.Appendf(nil, `{"id":%q,"version":2,"title":"t"}`, note)},
		"update without version":    {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteUpdated), Tenant: "acme", Subject: note, Data: fmt.Appendf(nil, `{"id":%q,"updated_at":%q,"title":"t"}`, note, updatedAt)},
		"update's title not a text": {ID: uuid.NewString(), Type: contract.CloudEventType(contract.EventNoteUpdated), Tenant: "acme", Subject: note, Data: fmt.Appendf(nil, `{"id":%q,"version":2,"updated_at":%q,"title":7}`, note, updatedAt)},
	} {
		t.Run(name, func(t *testing.T) {
			err := apply(t.Context(), pool, ev)
			require.Error(t, err)
			assert.True(t, consumer.IsPermanent(err), "%v is permanent", err)
		})
	}
	all, err := projection.List(t.Context(), pool)
	require.NoError(t, err)
	assert.Empty(t, all)
}

// TestSearch finds a tenant's live notes by the words of their titles.
func TestSearch(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	live, gone := uuid.NewString(), uuid.NewString()
	require.NoError(t, apply(t.Context(), pool, created(live, "Weekly groceries list", "")))
	require.NoError(t, apply(t.Context(), pool, created(gone, "Old groceries", "")))
	require.NoError(t, apply(t.Context(), pool, deleted(gone)))
	globex := created(uuid.NewString(), "Globex groceries", "")
	globex.Tenant = "globex"
	require.NoError(t, apply(t.Context(), pool, globex))

	for _, tc := range []struct {
		tenant, query string
		want          []string
	}{
		{"acme", "groceries", []string{live}},
		{"acme", "GROCERIES weekly", []string{live}},
		{"acme", "groceries monthly", nil},
		{"acme", "old", nil}, // deleted
		{"globex", "groceries", []string{globex.Subject}},
		{"acme", `'&|!(:*`, nil}, // any text is a query
	} {
		found, err := projection.Search(t.Context(), pool, tc.tenant, tc.query, 10)
		require.NoError(t, err, tc.query)
		var ids []string
		for _, n := range found {
			ids = append(ids, n.ID)
		}
		assert.Equal(t, tc.want, ids, "%s: %q", tc.tenant, tc.query)
	}
}
