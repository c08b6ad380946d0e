package notes_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
)

// Every derived id is an RFC 9562 version-8 UUID, the same for the same
// inputs, and different when any input differs — including inputs whose
// concatenations are equal.
func TestDerivedIDs(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	other := []byte("fedcba9876543210fedcba9876543210")
	note := notes.NoteID(secret, "acme", "k1", 0)
	event := notes.NoteEventID(note, 1, "k1")
	ids := map[string]uuid.UUID{
		"note":                    note,
		"another secret":          notes.NoteID(other, "acme", "k1", 0),
		"another tenant":          notes.NoteID(secret, "globex", "k1", 0),
		"another key":             notes.NoteID(secret, "acme", "k2", 0),
		"the next generation":     notes.NoteID(secret, "acme", "k1", 1),
		"tenant and key shifted":  notes.NoteID(secret, "acmek", "1", 0),
		"attachment":              notes.AttachmentID(note),
		"note.created":            event,
		"note.updated to 2":       notes.NoteEventID(note, 2, "u1"),
		"another update to 2":     notes.NoteEventID(note, 2, "u2"),
		"note.updated to 3":       notes.NoteEventID(note, 3, "u1"),
		"version 2, key 11":       notes.NoteEventID(note, 2, "11"),
		"version 21, key 1":       notes.NoteEventID(note, 21, "1"),
		"note.deleted at 4":       notes.NoteEventID(note, 4, "d1"),
		"attachment.processed":    notes.ProcessedEventID(event),
		"another note's created":  notes.NoteEventID(notes.NoteID(secret, "acme", "k2", 0), 1, "k2"),
		"processed of the note":   notes.ProcessedEventID(note),
		"attachment of the event": notes.AttachmentID(event),
	}
	seen := map[uuid.UUID]string{}
	for name, id := range ids {
		require.Equal(t, uuid.Version(8), id.Version(), name)
		require.Equal(t, uuid.RFC4122, id.Variant(), name)
		require.NotContains(t, seen, id, "%s has the id of %s", name, seen[id])
		seen[id] = name
	}
	require.Equal(t, note, notes.NoteID(secret, "acme", "k1", 0), "derived again")
	require.Equal(t, event, notes.NoteEventID(notes.NoteID(secret, "acme", "k1", 0), 1, "k1"))
}

func createNote(t *testing.T, svc *notes.Service, tenant, key, title string, data []byte) notes.NoteView {
	t.Helper()
	p := notes.CreateParams{Title: title}
	if data != nil {
		sum := sha256.Sum256(data)
		p.Attachment = &notes.NewAttachment{Filename: "a.txt", ContentType: "text/plain", Data: data, SHA256: hex.EncodeToString(sum[:])}
	}
	out, err := svc.Create(t.Context(), notes.Request{Tenant: tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite}, p)
	require.NoError(t, err)
	var v notes.NoteView
	require.NoError(t, json.Unmarshal(out.Body, &v))
	return v
}

func idSecret(t *testing.T, pool *pgxpool.Pool) []byte {
	t.Helper()
	var s []byte
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT secret FROM id_secret`).Scan(&s))
	require.Len(t, s, 32)
	return s
}

type createdIDs struct{ note, attachment, event string }

func idsOf(t *testing.T, pool *pgxpool.Pool, tenant string) []createdIDs {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT n.id::text, a.id::text, e.id::text
	FROM notes n JOIN attachments a ON a.note_id = n.id JOIN outbox_events e ON e.aggregate_id = n.id AND e.type = 'note.created'
	WHERE n.tenant = $1 ORDER BY n.id`, tenant)
	require.NoError(t, err)
	defer rows.Close()
	var out []createdIDs
	for rows.Next() {
		var c createdIDs
		require.NoError(t, rows.Scan(&c.note, &c.attachment, &c.event))
		out = append(out, c)
	}
	require.NoError(t, rows.Err())
	return out
}

// An operation whose every row was lost (a restore from a backup taken
// before it) and that is then executed again under its key produces the
// note, attachment and note.created event it produced the first time.
func TestCreateExecutedAgainAfterALossHasItsIDs(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 4)
	ctx := t.Context()
	tenant := reviewTenant()
	first := createNote(t, reviewService(t, pool, time.Second), tenant, "op-1", "restored", []byte("hello"))
	before := idsOf(t, pool, tenant)
	require.Len(t, before, 1)

	// What a restore from an older backup does to this operation.
	for _, q := range []string{
		`DELETE FROM outbox_events WHERE tenant = $1`,
		`DELETE FROM attachments WHERE tenant = $1`,
		`DELETE FROM notes WHERE tenant = $1`,
		`DELETE FROM operations WHERE tenant = $1`,
	} {
		_, err := pool.Exec(ctx, q, tenant)
		require.NoError(t, err)
	}
	again := createNote(t, reviewService(t, pool, time.Second), tenant, "op-1", "restored", []byte("hello"))
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, first.Attachment.ID, again.Attachment.ID)
	require.Equal(t, before, idsOf(t, pool, tenant), "note, attachment and note.created event ids")
	require.Equal(t, notes.NoteID(idSecret(t, pool), tenant, "op-1", 0).String(), again.ID)
}

// A key used for a new intent after it was forgotten (its record removed
// after QUILL_KEY_RETENTION) creates a new note beside the one it created
// before, which is kept, instead of colliding with it.
func TestKeyForgottenAndUsedAgainMakesANewNote(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 4)
	ctx := t.Context()
	tenant := reviewTenant()
	svc := reviewService(t, pool, 500*time.Millisecond)
	secret := idSecret(t, pool)
	var got []string
	for gen, title := range []string{"first intent", "second intent", "third intent"} {
		_, err := pool.Exec(ctx, `DELETE FROM operations WHERE tenant = $1`, tenant) // forgotten
		require.NoError(t, err)
		v := createNote(t, svc, tenant, "reused", title, nil)
		require.Equal(t, notes.NoteID(secret, tenant, "reused", gen).String(), v.ID, "generation %d", gen)
		got = append(got, v.ID)
	}
	require.Equal(t, 3, countNotes(t, pool, tenant))
	require.Len(t, map[string]bool{got[0]: true, got[1]: true, got[2]: true}, 3)
}

// Each database has its own id secret: the same tenant and key make
// different ids in two of them, so ids tell nothing about keys to anyone
// without the database.
func TestIDSecretIsPerDatabase(t *testing.T) {
	t.Parallel()
	a, _ := dbtest.Pool(t, 2)
	b, _ := dbtest.Pool(t, 2)
	require.NotEqual(t, idSecret(t, a), idSecret(t, b))
	tenant := reviewTenant()
	na := createNote(t, reviewService(t, a, time.Second), tenant, "same", "x", nil)
	nb := createNote(t, reviewService(t, b, time.Second), tenant, "same", "x", nil)
	require.NotEqual(t, na.ID, nb.ID)
}

// Derived ids carry no time: the list is still newest first.
func TestListIsNewestFirstWithDerivedIDs(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	tenant := reviewTenant()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { now = now.Add(time.Second); return now }
	svc, err := notes.NewService(pool, notes.Config{Wait: time.Second}, zerolog.Nop(), notes.WithClock(clock))
	require.NoError(t, err)
	var want []string
	for i := range 8 {
		v := createNote(t, svc, tenant, "k"+string(rune('a'+i)), "n", nil)
		want = append([]string{v.ID}, want...)
	}
	var got []string
	var after *uuid.UUID
	for {
		page, next, err := svc.List(context.Background(), tenant, 3, after, 0)
		require.NoError(t, err)
		for _, n := range page {
			got = append(got, n.ID.String())
		}
		if next == nil {
			break
		}
		after = next
	}
	require.Equal(t, want, got)
}

// The derived ids never change: an operation executed again by a later
// release must produce the ids it produced before (decision 0050). The
// values were computed by the derivations as they stood before issue 29
// rewrote them without allocations.
func TestDerivedIDsArePinned(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	note := notes.NoteID(secret, "acme", "k1", 0)
	for _, c := range []struct {
		name string
		got  uuid.UUID
		want string
	}{
		{"note", note, "487f2dcb-b32c-8c12-a7ec-cef0ebbbc0a1"},
		{"note, long unicode key, generation 15", notes.NoteID(secret, "t", "a-much-longer-key-with-ünïcode", 15), "3d17a32d-29a5-83c0-8be9-a58ef3eee8a0"},
		{"attachment", notes.AttachmentID(note), "95c471ae-8a02-820c-bb99-ef21997ed8e4"},
		{"note.created", notes.NoteEventID(note, 1, "k1"), "c357a80b-09a8-847b-a972-cc7d141d7cd1"},
		{"version 123456", notes.NoteEventID(note, 123456, "k2"), "951d7246-80f3-81a6-9090-314c3ece41c6"},
		{"attachment.processed", notes.ProcessedEventID(note), "2e671b21-c384-8c60-a4f6-9031b4591418"},
	} {
		require.Equal(t, c.want, c.got.String(), c.name)
	}
}
