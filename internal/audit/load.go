package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/migrations"
)

// Querier runs queries: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

type opRow struct {
	Tenant, Key, Action string
	Resource            string
	// Outcome is what the operation did (notes.Outcome*), Status the HTTP
	// status it answered with (0 for an outcome this audit does not know).
	Outcome string
	Status  int
	// ResourceVersion is the note version the operation left
	// (operations.resource_version): 0 for none (a 404, a 412) and for
	// records written before versions (migration 00016).
	ResourceVersion int
	// CurrentVersion is a refused write's (outcome version_mismatch) note
	// version as its recorded response names it (current_version); 0 once
	// the record is a tombstone.
	CurrentVersion int
	CreatedAt      time.Time
	CompletedAt    time.Time
	ExpiresAt      time.Time
	ForgetAt       time.Time
	CompactedAt    *time.Time
	Replays        int64
	// Cleaned are the operation's published events that the outbox
	// cleanup deleted, as the record keeps them (migration 00008).
	Cleaned []cleanedEvent
}

// cleanedEvent is one element of operations.cleaned_events.
type cleanedEvent struct {
	Seq         int64      `json:"seq"`
	ID          uuid.UUID  `json:"id"`
	Type        string     `json:"type"`
	PublishedAt *time.Time `json:"published_at"`
	StreamSeq   *int64     `json:"stream_seq"`
}

// noteID returns the note a write operation acted on.
func (o *opRow) noteID() (uuid.UUID, bool) {
	s, ok := contract.ParseNotePath(o.Resource)
	if !ok {
		return uuid.UUID{}, false
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}

// webhookID returns the webhook endpoint a webhook write acted on.
func (o *opRow) webhookID() (uuid.UUID, bool) {
	s, ok := strings.CutPrefix(o.Resource, contract.WebhooksPath+"/")
	if !ok {
		return uuid.UUID{}, false
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}

// webhookRow is a webhook endpoint (the API's webhook_endpoints row).
type webhookRow struct {
	ID        uuid.UUID
	Tenant    string
	DeletedAt *time.Time
}

type noteRow struct {
	ID        uuid.UUID
	Tenant    string
	CreatedAt time.Time
	DeletedAt *time.Time
	// Version is notes.version: 1 at create, one more per change (an
	// update that changed the note, the delete).
	Version   int
	UpdatedAt *time.Time
}

type attRow struct {
	ID          uuid.UUID
	NoteID      uuid.UUID
	Tenant      string
	Status      string
	Reason      *string
	ProcessedAt *time.Time
}

type eventRow struct {
	Seq          int64
	ID           uuid.UUID
	Tenant       string
	OpKey        string
	AggregateID  uuid.UUID
	Type         string
	CreatedAt    time.Time
	PublishedAt  *time.Time
	StreamSeq    *int64
	ParkedAt     *time.Time
	ParkedReason *string
	Attempts     int
	LastError    *string
	AckDuplicate *bool
	// Queued: the event has a row in the relays' queue (outbox_pending,
	// 00007); nil before that migration.
	Queued *bool
	// Version is a note event's data.version: 0 for other events and for
	// note events written before versions (migration 00016), which carry
	// none.
	Version int

	// stream is what the stream check found at StreamSeq.
	stream string
}

type inboxRow struct {
	EventID     uuid.UUID
	ProcessedAt time.Time
	Deliveries  *int64
	Duplicates  *int64
}

type deadRow struct {
	ID         int64
	EventID    string
	Subject    string
	Error      string
	Deliveries int
	CreatedAt  time.Time
}

// ErrSchemaVersion is returned when the database's schema is not the one
// the embedded migrations define: the audit reads exactly that schema.
var ErrSchemaVersion = errors.New("the database schema is not at the current migration")

// undefinedTable is PostgreSQL's SQLSTATE for a missing table: here, goose's
// version table in a database never migrated.
const undefinedTable = "42P01"

// sqlSchemaVersion is goose's record of the latest migration applied,
// resolved through the search_path as every query of the audit is.
const sqlSchemaVersion = `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`

// latestMigration is the version of the newest embedded migration: the
// leading number of its file name (NNNNN_description.sql).
func latestMigration() (int64, error) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return 0, err
	}
	var latest int64
	for _, name := range names {
		digits, _, _ := strings.Cut(name, "_")
		v, err := strconv.ParseInt(digits, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("migration %s: %w", name, err)
		}
		latest = max(latest, v)
	}
	return latest, nil
}

// checkSchema returns ErrSchemaVersion, with both versions, unless the
// database is migrated to the latest embedded migration.
func checkSchema(ctx context.Context, q Querier) error {
	want, err := latestMigration()
	if err != nil {
		return fmt.Errorf("embedded migrations: %w", err)
	}
	var have int64
	if err := q.QueryRow(ctx, sqlSchemaVersion).Scan(&have); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
			return fmt.Errorf("%w: it has no migrations applied, the audit needs version %d: run api migrate", ErrSchemaVersion, want)
		}
		return fmt.Errorf("read schema version: %w", err)
	}
	if have != want {
		return fmt.Errorf("%w: it is at version %d, the audit needs version %d: run api migrate (or audit with the api of that version)", ErrSchemaVersion, have, want)
	}
	return nil
}

// Scope filters: $1 tenant (” = all), and in key mode $2 key and $3 the
// notes the key's chain touches.
const (
	// The status of each outcome is the API's (SPEC §3); a refused
	// write's recorded response is read for its current_version.
	sqlOperations = `SELECT tenant, key, action, coalesce(resource, ''), outcome,
		CASE outcome WHEN 'created' THEN 201 WHEN 'deleted' THEN 200 WHEN 'updated' THEN 200 WHEN 'unchanged' THEN 200
			WHEN 'nothing_to_delete' THEN 404 WHEN 'nothing_to_update' THEN 404 WHEN 'version_mismatch' THEN 412 ELSE 0 END,
		coalesce(resource_version, 0), CASE WHEN outcome = 'version_mismatch' THEN response_body END,
		created_at, completed_at, expires_at, forget_at, compacted_at, replays::bigint, coalesce(cleaned_events, '[]'::jsonb)
	FROM operations WHERE ($1 = '' OR tenant = $1)
	  AND ($2 = '' OR key = $2 OR resource = ANY($3::text[]))
	ORDER BY tenant, created_at, key`

	sqlNotes = `SELECT id, tenant, created_at, deleted_at, version, updated_at FROM notes
	WHERE ($1 = '' OR tenant = $1) AND ($2 = '' OR id = ANY($3::uuid[]))`

	sqlAttachments = `SELECT id, note_id, tenant, status, reason, processed_at FROM attachments
	WHERE ($1 = '' OR tenant = $1) AND ($2 = '' OR note_id = ANY($3::uuid[]))`

	// Endpoints are never removed, only marked deleted, and a tenant has
	// few: the scope's tenant's all, in key mode too.
	sqlWebhooks = `SELECT id, tenant, deleted_at FROM webhook_endpoints WHERE ($1 = '' OR tenant = $1)`

	sqlKeyEventNotes = `SELECT DISTINCT aggregate_id FROM outbox_events WHERE tenant = $1 AND operation_key = $2`

	sqlKeyOperation = `SELECT coalesce(resource, '') FROM operations WHERE tenant = $1 AND key = $2`

	// The worker's inbox and dead letters are the consumer package's
	// tables (consumer.DefaultTablePrefix), under its durable name.
	sqlDeadLetters = `SELECT id, event_id, subject, reason, deliveries, created_at FROM quill_consumer_dead_letters
	WHERE consumer = $1 AND retried_at IS NULL ORDER BY id`

	sqlEvents = `SELECT seq, id, tenant, coalesce(operation_key, ''), aggregate_id, type, created_at, published_at,
		stream_seq, parked_at, parked_reason, attempts, last_error, ack_duplicate,
		EXISTS (SELECT 1 FROM outbox_pending q WHERE q.seq = outbox_events.seq),
		CASE WHEN type IN ('note.created', 'note.updated', 'note.deleted')
			THEN convert_from(payload, 'UTF8')::jsonb #>> '{data,version}' END
	FROM outbox_events WHERE ($1 = '' OR tenant = $1)
	  AND ($2 = '' OR operation_key = $2 OR aggregate_id = ANY($3::uuid[]))
	ORDER BY seq`

	sqlInbox = `SELECT event_id, processed_at, deliveries::bigint, duplicates::bigint
	FROM quill_consumer_inbox WHERE consumer = $1 AND event_id = ANY($2::uuid[])`

	sqlInboxTotals = `SELECT count(*), coalesce(sum(deliveries), 0)::bigint, coalesce(sum(duplicates), 0)::bigint
	FROM quill_consumer_inbox WHERE consumer = $1`
)

// dataset is everything in the audit's scope, read in one REPEATABLE READ
// transaction so that the tables agree with each other.
type dataset struct {
	ops    []*opRow
	notes  map[uuid.UUID]*noteRow
	hooks  map[uuid.UUID]*webhookRow
	atts   map[uuid.UUID]*attRow // by note id
	events []*eventRow
	inbox  map[uuid.UUID]*inboxRow
	dead   []*deadRow
	// inboxRows, inboxDeliveries and inboxDuplicates total the consumer's
	// inbox: all of it for a whole audit, the scope's events otherwise.
	inboxRows                        int64
	inboxDeliveries, inboxDuplicates *int64
}

func load(ctx context.Context, tx pgx.Tx, cfg Config) (*dataset, error) {
	ds := &dataset{notes: map[uuid.UUID]*noteRow{}, hooks: map[uuid.UUID]*webhookRow{}, atts: map[uuid.UUID]*attRow{}, inbox: map[uuid.UUID]*inboxRow{}}
	if err := checkSchema(ctx, tx); err != nil {
		return nil, err
	}
	// In key mode the scope is the key's notes: the one its record names and
	// those its events are about (two, if it duplicated).
	noteIDs := []uuid.UUID{}
	resources := []string{}
	if cfg.Key != "" {
		var res string
		err := tx.QueryRow(ctx, sqlKeyOperation, cfg.Tenant, cfg.Key).Scan(&res)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read operation: %w", err)
		}
		op := opRow{Resource: res}
		if id, ok := op.noteID(); ok {
			noteIDs = append(noteIDs, id)
		}
		rows, err := tx.Query(ctx, sqlKeyEventNotes, cfg.Tenant, cfg.Key)
		if err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		for _, id := range ids {
			if !containsUUID(noteIDs, id) {
				noteIDs = append(noteIDs, id)
			}
		}
		for _, id := range noteIDs {
			resources = append(resources, contract.NotePath(id.String()))
		}
	}

	var err error
	ds.ops, err = readRows(ctx, tx, "operations", func(r pgx.CollectableRow, o *opRow) error {
		var refused []byte
		err := r.Scan(&o.Tenant, &o.Key, &o.Action, &o.Resource, &o.Outcome, &o.Status, &o.ResourceVersion, &refused,
			&o.CreatedAt, &o.CompletedAt, &o.ExpiresAt, &o.ForgetAt, &o.CompactedAt, &o.Replays, &o.Cleaned)
		o.CurrentVersion = currentVersion(refused)
		return err
	}, sqlOperations, cfg.Tenant, cfg.Key, resources)
	if err != nil {
		return nil, err
	}

	notes, err := readRows(ctx, tx, "notes", func(r pgx.CollectableRow, n *noteRow) error {
		return r.Scan(&n.ID, &n.Tenant, &n.CreatedAt, &n.DeletedAt, &n.Version, &n.UpdatedAt)
	}, sqlNotes, cfg.Tenant, cfg.Key, noteIDs)
	if err != nil {
		return nil, err
	}
	for _, n := range notes {
		ds.notes[n.ID] = n
	}

	hooks, err := readRows(ctx, tx, "webhook endpoints", func(r pgx.CollectableRow, w *webhookRow) error {
		return r.Scan(&w.ID, &w.Tenant, &w.DeletedAt)
	}, sqlWebhooks, cfg.Tenant)
	if err != nil {
		return nil, err
	}
	for _, w := range hooks {
		ds.hooks[w.ID] = w
	}

	atts, err := readRows(ctx, tx, "attachments", func(r pgx.CollectableRow, a *attRow) error {
		return r.Scan(&a.ID, &a.NoteID, &a.Tenant, &a.Status, &a.Reason, &a.ProcessedAt)
	}, sqlAttachments, cfg.Tenant, cfg.Key, noteIDs)
	if err != nil {
		return nil, err
	}
	for _, a := range atts {
		ds.atts[a.NoteID] = a
	}

	ds.events, err = readRows(ctx, tx, "outbox events", func(r pgx.CollectableRow, e *eventRow) error {
		var version *string
		err := r.Scan(&e.Seq, &e.ID, &e.Tenant, &e.OpKey, &e.AggregateID, &e.Type, &e.CreatedAt, &e.PublishedAt,
			&e.StreamSeq, &e.ParkedAt, &e.ParkedReason, &e.Attempts, &e.LastError, &e.AckDuplicate, &e.Queued, &version)
		if version != nil {
			// Not a positive integer (a payload no Quill wrote): no
			// version, as for an event written before versions.
			if v, err := strconv.Atoi(*version); err == nil && v > 0 {
				e.Version = v
			}
		}
		return err
	}, sqlEvents, cfg.Tenant, cfg.Key, noteIDs)
	if err != nil {
		return nil, err
	}

	var created []uuid.UUID
	for _, e := range ds.events {
		if e.Type == contract.EventNoteCreated {
			created = append(created, e.ID)
		}
	}
	inbox, err := readRows(ctx, tx, "inbox", func(r pgx.CollectableRow, i *inboxRow) error {
		return r.Scan(&i.EventID, &i.ProcessedAt, &i.Deliveries, &i.Duplicates)
	}, sqlInbox, cfg.Consumer, created)
	if err != nil {
		return nil, err
	}
	for _, i := range inbox {
		ds.inbox[i.EventID] = i
	}
	if cfg.Tenant == "" {
		err := tx.QueryRow(ctx, sqlInboxTotals, cfg.Consumer).Scan(&ds.inboxRows, &ds.inboxDeliveries, &ds.inboxDuplicates)
		if err != nil {
			return nil, fmt.Errorf("read inbox totals: %w", err)
		}
	} else {
		ds.inboxRows = int64(len(inbox))
		ds.inboxDeliveries, ds.inboxDuplicates = new(int64), new(int64)
		for _, i := range inbox {
			*ds.inboxDeliveries += *i.Deliveries
			*ds.inboxDuplicates += *i.Duplicates
		}
	}

	dead, err := readRows(ctx, tx, "dead letters", func(r pgx.CollectableRow, d *deadRow) error {
		return r.Scan(&d.ID, &d.EventID, &d.Subject, &d.Error, &d.Deliveries, &d.CreatedAt)
	}, sqlDeadLetters, cfg.Consumer)
	if err != nil {
		return nil, err
	}
	for _, d := range dead {
		if cfg.Tenant != "" && contract.SubjectTenant(cfg.Stream.SubjectPrefix, d.Subject) != cfg.Tenant {
			continue
		}
		ds.dead = append(ds.dead, d)
	}
	return ds, nil
}

// readRows runs query with args on tx and collects its rows, each scanned
// into a new T by scan. An error is wrapped as "read what: ...".
func readRows[T any](ctx context.Context, tx pgx.Tx, what string, scan func(pgx.CollectableRow, *T) error, query string, args ...any) ([]*T, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*T, error) {
		var v T
		err := scan(r, &v)
		return &v, err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return out, nil
}

// currentVersion is the current_version a refused write's recorded
// problem names; 0 without one (a tombstone, a body that is not the API's).
func currentVersion(body []byte) int {
	if body == nil {
		return 0
	}
	var p struct {
		CurrentVersion int `json:"current_version"`
	}
	if json.Unmarshal(body, &p) != nil {
		return 0
	}
	return p.CurrentVersion
}

func containsUUID(ids []uuid.UUID, id uuid.UUID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
