package notes_test

import (
	"io"
	"sync"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/retention"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

type lookupBundle struct {
	pool   *pgxpool.Pool
	svc    *notes.Service
	clock  *clock
	tenant string
}

func setupLookup(t *testing.T) *lookupBundle {
	t.Helper()
	pool, _ := dbtest.Pool(t, 4)
	c := &clock{t: time.Now().UTC().Truncate(time.Microsecond)}
	svc, err := notes.NewService(pool, notes.Config{}, zerolog.New(io.Discard), notes.WithClock(c.now))
	require.NoError(t, err)
	return &lookupBundle{pool: pool, svc: svc, clock: c, tenant: reviewTenant()}
}

func (b *lookupBundle) create(t *testing.T, key string, p notes.CreateParams) {
	t.Helper()
	_, err := b.svc.Create(t.Context(), notes.Request{Tenant: b.tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite}, p)
	require.NoError(t, err)
}

// publishAll marks every unpublished event published at the clock's time,
// as the relay would, with stream sequences from 100 on.
func (b *lookupBundle) publishAll(t *testing.T) {
	t.Helper()
	_, err := b.pool.Exec(t.Context(), `UPDATE outbox_events SET published_at = $1, stream_seq = 100 + seq
		WHERE published_at IS NULL`, b.clock.now())
	require.NoError(t, err)
}

// clean runs one retention pass at the clock's time.
func (b *lookupBundle) clean(t *testing.T) {
	t.Helper()
	// The retention service's steps, as of the test's clock rather than
	// the database's (whose time the test cannot move).
	_, err := outbox.DeletePublished(t.Context(), b.pool, b.clock.now(), retention.DefaultOutboxRetention, retention.DefaultBatch)
	require.NoError(t, err)
	_, err = idempotency.Compact(t.Context(), b.pool, b.clock.now(), retention.DefaultBatch)
	require.NoError(t, err)
	_, err = idempotency.Forget(t.Context(), b.pool, b.clock.now(), retention.DefaultBatch)
	require.NoError(t, err)
}

func (b *lookupBundle) outboxEvents(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_events`).Scan(&n))
	return n
}

func (b *lookupBundle) lookup(t *testing.T, key string) *notes.Operation {
	t.Helper()
	op, err := b.svc.Lookup(t.Context(), b.tenant, key)
	require.NoError(t, err)
	return op
}

// The outbox forgets published events after QUILL_OUTBOX_RETENTION while
// the key is remembered for QUILL_KEY_RETENTION: the lookup still lists
// them, with their ids, publication times and stream sequences, for as
// long as it answers at all — never "effects": [] for an operation that
// had effects.
func TestLookupListsEventsTheOutboxCleanupDeleted(t *testing.T) {
	t.Parallel()
	b := setupLookup(t)
	b.create(t, "create", notes.CreateParams{Title: "kept", Attachment: &notes.NewAttachment{
		Filename: "a.txt", ContentType: "text/plain", Data: []byte("hi"), SHA256: "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"}})
	created := b.lookup(t, "create")
	require.Len(t, created.Effects, 2)
	noteID := created.Resource
	b.publishAll(t)
	published := b.lookup(t, "create")
	require.Equal(t, notes.EventPublished, published.Effects[0].State)

	// Delete the note too: a second operation with its own event.
	b.clock.advance(time.Hour)
	id := (*noteID)[len("/v1/notes/"):]
	_, err := b.svc.Delete(t.Context(), notes.Request{Tenant: b.tenant, Key: "delete", Wait: -1, Render: httpapi.RenderWrite}, uuid.MustParse(id))
	require.NoError(t, err)
	b.publishAll(t)
	deleted := b.lookup(t, "delete")
	require.Len(t, deleted.Effects, 1)

	// Past the outbox retention of both, within the key retention.
	b.clock.advance(retention.DefaultOutboxRetention + time.Hour)
	b.clean(t)
	require.Zero(t, b.outboxEvents(t), "the cleanup deleted the published events")

	after := b.lookup(t, "create")
	require.Equal(t, contract.OperationCompleted, after.State)
	require.Nil(t, after.Response, "a tombstone by now")
	require.Equal(t, published.Effects, after.Effects, "the same event, as published, and the attachment")
	require.Equal(t, deleted.Effects, b.lookup(t, "delete").Effects)

	// Another pass deletes nothing more and keeps nothing twice.
	b.clean(t)
	require.Equal(t, published.Effects, b.lookup(t, "create").Effects)

	// Past the key retention the key is forgotten: 404, and the kept
	// events go with the record.
	b.clock.advance(idempotency.DefaultKeyRetention)
	b.clean(t)
	_, err = b.svc.Lookup(t.Context(), b.tenant, "create")
	require.ErrorIs(t, err, notes.ErrOperationNotFound)
}

// A key executed again after it was forgotten lists only its current
// operation's events, also once the earlier operation's event leaves the
// outbox after the new record was written.
func TestLookupKeepsNoEventOfAnEarlierExecutionUnderTheKey(t *testing.T) {
	t.Parallel()
	b := setupLookup(t)
	b.create(t, "k", notes.CreateParams{Title: "first"})
	b.publishAll(t)
	first := b.lookup(t, "k").Effects
	require.Len(t, first, 1)

	// Forgotten before its event left the outbox (a key retention
	// shorter than the outbox retention), then executed again.
	b.clock.advance(idempotency.DefaultKeyRetention + time.Hour)
	b.create(t, "k", notes.CreateParams{Title: "second"})
	b.publishAll(t)
	second := b.lookup(t, "k").Effects
	require.Len(t, second, 1)
	require.NotEqual(t, first[0].ID, second[0].ID)

	// Both events leave the outbox in one cleanup statement: only the
	// second is kept, by the current record.
	b.clock.advance(retention.DefaultOutboxRetention + time.Hour)
	b.clean(t)
	require.Zero(t, b.outboxEvents(t))
	require.Equal(t, second, b.lookup(t, "k").Effects)
	var kept int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT jsonb_array_length(cleaned_events) FROM operations WHERE key = 'k'`).Scan(&kept))
	require.Equal(t, 1, kept, "the earlier execution's event is not the current operation's")
}

// An event whose row is gone while the record kept nothing of it — deleted
// before migration 00008 (simulated: its trigger disabled), or deleted by
// hand before it was published — is named as forgotten, with its type; an
// operation that wrote no event (a delete that found nothing) lists none.
func TestLookupNamesEventsForgottenWithoutTheRecord(t *testing.T) {
	t.Parallel()
	b := setupLookup(t)
	b.create(t, "old", notes.CreateParams{Title: "before 00008"})
	b.create(t, "dropped", notes.CreateParams{Title: "dropped by hand"})
	id := (*b.lookup(t, "old").Resource)[len("/v1/notes/"):]
	del := func(key string) {
		_, err := b.svc.Delete(t.Context(), notes.Request{Tenant: b.tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite}, uuid.MustParse(id))
		require.NoError(t, err)
	}
	b.clock.advance(time.Second)
	del("delete")
	b.clock.advance(time.Second)
	del("delete-again") // nothing left to delete: no event
	require.Empty(t, b.lookup(t, "delete-again").Effects)

	_, err := b.pool.Exec(t.Context(), `DELETE FROM outbox_events WHERE operation_key = 'dropped'`)
	require.NoError(t, err)
	b.publishAll(t)
	_, err = b.pool.Exec(t.Context(), `ALTER TABLE outbox_events DISABLE TRIGGER operations_keep_cleaned_events`)
	require.NoError(t, err)
	b.clock.advance(retention.DefaultOutboxRetention + time.Hour)
	b.clean(t)
	require.Zero(t, b.outboxEvents(t))

	for key, typ := range map[string]string{"old": "quill.note.created.v1", "dropped": "quill.note.created.v1", "delete": "quill.note.deleted.v1"} {
		effects := b.lookup(t, key).Effects
		require.Equal(t, []notes.Effect{{Kind: notes.EffectEvent, Type: typ, State: notes.EventForgotten}}, effects, key)
	}
	require.Empty(t, b.lookup(t, "delete-again").Effects)
}

// SPEC §4.6: published_at, stream_seq (events) and processed_at
// (attachments) are present, and null, while the effect is pending; each
// kind carries only its own members.
func TestEffectJSONHasTheMembersOfItsKind(t *testing.T) {
	t.Parallel()
	at, seq := "2026-12-01T00:00:00.000000Z", int64(7)
	cases := []struct {
		name string
		e    notes.Effect
		want string
	}{
		{"pending event", notes.Effect{Kind: notes.EffectEvent, ID: "e", Type: "quill.note.created.v1", State: notes.EventPending},
			`{"kind":"event","id":"e","type":"quill.note.created.v1","state":"pending","published_at":null,"stream_seq":null}`},
		{"published event", notes.Effect{Kind: notes.EffectEvent, ID: "e", Type: "quill.note.created.v1", State: notes.EventPublished, PublishedAt: &at, StreamSeq: &seq},
			`{"kind":"event","id":"e","type":"quill.note.created.v1","state":"published","published_at":"2026-12-01T00:00:00.000000Z","stream_seq":7}`},
		{"forgotten event", notes.Effect{Kind: notes.EffectEvent, Type: "quill.note.created.v1", State: notes.EventForgotten},
			`{"kind":"event","id":null,"type":"quill.note.created.v1","state":"forgotten","published_at":null,"stream_seq":null}`},
		{"pending attachment", notes.Effect{Kind: notes.EffectAttachment, ID: "a", State: notes.AttachmentPending},
			`{"kind":"attachment","id":"a","state":"pending","processed_at":null}`},
		{"skipped attachment", notes.Effect{Kind: notes.EffectAttachment, ID: "a", State: notes.AttachmentPending, Reason: "skipped"},
			`{"kind":"attachment","id":"a","state":"pending","processed_at":null,"reason":"skipped"}`},
		{"processed attachment", notes.Effect{Kind: notes.EffectAttachment, ID: "a", State: notes.AttachmentProcessed, ProcessedAt: &at},
			`{"kind":"attachment","id":"a","state":"processed","processed_at":"2026-12-01T00:00:00.000000Z"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := json.Marshal(tc.e)
			require.NoError(t, err)
			require.JSONEq(t, tc.want, string(got))
		})
	}
	_, err := json.Marshal(notes.Effect{Kind: "mystery"})
	require.ErrorContains(t, err, `unknown kind "mystery"`)
}
