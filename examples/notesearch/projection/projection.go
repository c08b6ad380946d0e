// Package projection is notesearch's read model: a per-tenant table of
// notes with a searchable title, kept from Quill's note.created,
// note.updated and note.deleted events. Apply is a consumer.Handler: it
// writes through the consumer's transaction, which already holds the
// event's inbox row — and, under the consumer's version guard, the note's
// version row — so each event changes the table once however often it is
// delivered, and a note's updates apply in version order.
package projection

import (
	"context"
	_ "embed"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
)

//go:embed schema.sql
var schemaSQL string

// schemaLock is the advisory lock that serialises Migrate across processes:
// two concurrent CREATE TABLE IF NOT EXISTS may otherwise both try to create
// the table's type and one fails.
const schemaLock = 0x6e6f746573656172 // "notesear"

// Migrate creates the projection's table in the schema pool's search_path
// names, unless it exists. It returns the database's error, wrapped.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(schemaLock)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("projection schema: %w", err)
	}
	return nil
}

// noteCreated is the part of a note.created event's data the projection
// keeps: the body only as its length.
type noteCreated struct {
	ID        string    `json:"id"`
	Title     string    `json:"title"`
	Body      string    `json:"body"`
	CreatedAt time.Time `json:"created_at"`
}

// noteUpdated is a note.updated event's data: the fields that changed,
// nil for those that did not.
type noteUpdated struct {
	ID        string    `json:"id"`
	Title     *string   `json:"title"`
	Body      *string   `json:"body"`
	UpdatedAt time.Time `json:"updated_at"`
}

// noteDeleted is a note.deleted event's data.
type noteDeleted struct {
	ID        string    `json:"id"`
	DeletedAt time.Time `json:"deleted_at"`
}

const (
	// A create that finds a tombstone counts itself and leaves the title
	// and body length empty: the note stays deleted.
	sqlNoteCreate = `INSERT INTO notesearch_notes AS n
		(tenant, note_id, title, body_length, created_at, created_applied, version)
	VALUES ($1, $2, $3, $4, $5, 1, $6)
	ON CONFLICT (tenant, note_id) DO UPDATE SET
		title           = CASE WHEN n.deleted_at IS NULL THEN EXCLUDED.title END,
		body_length     = CASE WHEN n.deleted_at IS NULL THEN EXCLUDED.body_length END,
		created_at      = EXCLUDED.created_at,
		created_applied = n.created_applied + 1,
		version         = coalesce(n.version, EXCLUDED.version)`

	// An update changes only the fields its event names (NULL: unchanged).
	// The consumer's guard (VersionsInOrder) hands a note's updates over
	// in version order, each after the one before it, so none of their
	// fields is lost. An update of a tombstone changes nothing; one that
	// finds no row (notesearch started after the note's create was gone
	// from the stream) inserts what it knows.
	sqlNoteUpdate = `INSERT INTO notesearch_notes AS n
		(tenant, note_id, title, body_length, updated_applied, version)
	VALUES ($1, $2, $3, $4, 1, $5)
	ON CONFLICT (tenant, note_id) DO UPDATE SET
		title           = CASE WHEN n.deleted_at IS NULL THEN coalesce(EXCLUDED.title, n.title) END,
		body_length     = CASE WHEN n.deleted_at IS NULL THEN coalesce(EXCLUDED.body_length, n.body_length) END,
		updated_applied = n.updated_applied + 1,
		version         = CASE WHEN n.deleted_at IS NULL THEN EXCLUDED.version ELSE n.version END`

	// A delete that arrives first leaves a tombstone; one that finds the
	// note clears what made it searchable. The first deletion time stays.
	sqlNoteDelete = `INSERT INTO notesearch_notes AS n
		(tenant, note_id, deleted_at, deleted_applied, version)
	VALUES ($1, $2, $3, 1, $4)
	ON CONFLICT (tenant, note_id) DO UPDATE SET
		title           = NULL,
		body_length     = NULL,
		deleted_at      = coalesce(n.deleted_at, EXCLUDED.deleted_at),
		deleted_applied = n.deleted_applied + 1,
		version         = CASE WHEN n.deleted_at IS NULL THEN coalesce(EXCLUDED.version, n.version) ELSE n.version END`
)

// Apply applies one event to the projection within tx: a note.created
// inserts the note, a note.updated changes the title and body length it
// names, a note.deleted marks it deleted (or leaves a tombstone when the
// create has not come yet); any other type changes nothing. The row keeps
// the note's version (Event.Version) of the event applied last. An
// event whose data cannot be read, or names another note than its subject,
// is a consumer.Permanent error: no redelivery can cure it, so the consumer
// makes it a dead letter. Other errors are the database's, wrapped, and
// the consumer retries them.
func Apply(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
	switch ev.Type {
	case contract.CloudEventType(contract.EventNoteCreated):
		var d noteCreated
		if err := decode(ev, &d, &d.ID); err != nil {
			return err
		}
		if d.CreatedAt.IsZero() {
			return consumer.Permanent(fmt.Errorf("%s %s: data has no created_at", ev.Type, ev.ID))
		}
		if _, err := tx.Exec(ctx, sqlNoteCreate, ev.Tenant, ev.Subject, d.Title, utf8.RuneCountInString(d.Body), d.CreatedAt, version(ev)); err != nil {
			return fmt.Errorf("apply note.created %s: %w", ev.ID, err)
		}
	case contract.CloudEventType(contract.EventNoteUpdated):
		var d noteUpdated
		if err := decode(ev, &d, &d.ID); err != nil {
			return err
		}
		v := version(ev)
		if d.UpdatedAt.IsZero() || v == nil {
			return consumer.Permanent(fmt.Errorf("%s %s: data has no updated_at or no version", ev.Type, ev.ID))
		}
		var bodyLength *int
		if d.Body != nil {
			bodyLength = new(utf8.RuneCountInString(*d.Body))
		}
		if _, err := tx.Exec(ctx, sqlNoteUpdate, ev.Tenant, ev.Subject, d.Title, bodyLength, v); err != nil {
			return fmt.Errorf("apply note.updated %s: %w", ev.ID, err)
		}
	case contract.CloudEventType(contract.EventNoteDeleted):
		var d noteDeleted
		if err := decode(ev, &d, &d.ID); err != nil {
			return err
		}
		if d.DeletedAt.IsZero() {
			return consumer.Permanent(fmt.Errorf("%s %s: data has no deleted_at", ev.Type, ev.ID))
		}
		if _, err := tx.Exec(ctx, sqlNoteDelete, ev.Tenant, ev.Subject, d.DeletedAt, version(ev)); err != nil {
			return fmt.Errorf("apply note.deleted %s: %w", ev.ID, err)
		}
	}
	// Another type (the filter lets none through) is recorded in the inbox
	// and acknowledged: nothing to apply.
	return nil
}

// version is ev's note version, nil for an event without one (written
// before Quill versioned notes).
func version(ev consumer.Event) *int64 {
	if v, ok := ev.Version(); ok {
		return &v
	}
	return nil
}

// decode unmarshals ev's data into v and checks that the note id it names,
// *id, is ev's subject, a UUID: the row is keyed by the subject.
func decode(ev consumer.Event, v any, id *string) error {
	if err := json.Unmarshal(ev.Data, v, json.RejectUnknownMembers(false)); err != nil {
		return consumer.Permanent(fmt.Errorf("%s %s: data: %w", ev.Type, ev.ID, err))
	}
	if _, err := uuid.Parse(ev.Subject); err != nil {
		return consumer.Permanent(fmt.Errorf("%s %s: subject %q is not a note id", ev.Type, ev.ID, ev.Subject))
	}
	if *id != ev.Subject {
		return consumer.Permanent(fmt.Errorf("%s %s: data names note %q, the subject %q", ev.Type, ev.ID, *id, ev.Subject))
	}
	return nil
}

// Note is one row of the projection.
type Note struct {
	Tenant     string
	ID         string
	Title      *string // nil for a deleted note
	BodyLength *int    // nil for a deleted note
	CreatedAt  *time.Time
	DeletedAt  *time.Time
	// Version is the note's version of the event applied last; nil while
	// only events without one were.
	Version *int64
	// CreatedApplied, UpdatedApplied and DeletedApplied count the
	// note.created, note.updated and note.deleted events applied to the
	// row.
	CreatedApplied, UpdatedApplied, DeletedApplied int
}

// Deleted reports whether the note is deleted (a tombstone).
func (n Note) Deleted() bool { return n.DeletedAt != nil }

const sqlNotesList = `SELECT tenant, note_id::text, title, body_length, created_at, deleted_at, version, created_applied, updated_applied, deleted_applied
	FROM notesearch_notes ORDER BY tenant, note_id`

// List returns every row of the projection, tombstones included, by tenant
// and note id. It returns the database's error, wrapped.
func List(ctx context.Context, db *pgxpool.Pool) ([]Note, error) {
	return queryNotes(ctx, db, "list notes", sqlNotesList)
}

// queryNotes runs sql, a query of the projection's Note columns, and
// collects its rows; an error is wrapped with what.
func queryNotes(ctx context.Context, db *pgxpool.Pool, what, sql string, args ...any) ([]Note, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scanNote)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

func scanNote(r pgx.CollectableRow) (Note, error) {
	var n Note
	err := r.Scan(&n.Tenant, &n.ID, &n.Title, &n.BodyLength, &n.CreatedAt, &n.DeletedAt, &n.Version, &n.CreatedApplied, &n.UpdatedApplied, &n.DeletedApplied)
	return n, err
}

// The query is parsed by plainto_tsquery: any text is a valid query.
const sqlNotesSearch = `SELECT tenant, note_id::text, title, body_length, created_at, deleted_at, version, created_applied, updated_applied, deleted_applied
	FROM notesearch_notes
	WHERE tenant = $1 AND deleted_at IS NULL AND title_tsv @@ plainto_tsquery('simple', $2)
	ORDER BY created_at DESC, note_id LIMIT $3`

// Search returns up to limit live notes of tenant whose title holds every
// word of query, newest first. It returns the database's error, wrapped.
func Search(ctx context.Context, db *pgxpool.Pool, tenant, query string, limit int) ([]Note, error) {
	return queryNotes(ctx, db, "search notes", sqlNotesSearch, tenant, query, limit)
}
