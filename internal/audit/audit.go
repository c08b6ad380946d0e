// Package audit reconciles what Quill recorded at each layer of one business
// operation — the operation record, its note and attachment, its outbox
// events, the stream's messages and the worker's inbox — and reports every
// chain that does not add up: an effect without its operation record, an
// event stuck unpublished or parked, a published note.created event the
// worker never processed, a duplicate effect, a published event whose stream
// sequence holds something else. Per note it checks the version history:
// its events' versions (note.created 1, each note.updated its own,
// note.deleted the last) are each carried once, without gaps, up to the
// note's version. It also counts requests, business effects, replays and
// the duplicates each layer suppressed.
//
// Retention makes records disappear on purpose: operation records are
// compacted to tombstones after the response retention and deleted after the
// key retention, published outbox events after the outbox retention, inbox
// rows after the inbox retention, stream messages after the stream's MaxAge.
// The audit flags a missing record only when its horizon cannot explain the
// absence: the effect is younger than the retention that would have removed
// the record (less a margin for clock skew). Older effects whose records are
// legitimately gone are not anomalies.
package audit

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/retention"
	"github.com/quillhq/quill/internal/stream"
)

// Defaults of Config.
const (
	DefaultConsumer          = "attachment-worker"
	DefaultResponseRetention = 72 * time.Hour
	DefaultKeyRetention      = 720 * time.Hour
	DefaultPendingThreshold  = time.Minute
	DefaultProcessThreshold  = 5 * time.Minute
	DefaultHorizonMargin     = time.Minute
)

// Config says what to audit and with which horizons. Every zero field takes
// its default.
type Config struct {
	// Tenant limits the audit to one tenant; empty: every tenant.
	Tenant string
	// Key limits it to one operation key (Tenant required): its chain is
	// the key's record, the notes it acted on, their attachments and every
	// event about them.
	Key string
	// Stream names the stream and its subject prefix; its zero fields take
	// stream's defaults.
	Stream stream.Config
	// Consumer is the inbox's consumer (QUILL_CONSUMER). Default
	// attachment-worker.
	Consumer string
	// ResponseRetention (QUILL_IDEMPOTENCY_RETENTION), default 72h: only
	// reported; a tombstone still links an operation to its effects.
	ResponseRetention time.Duration
	// KeyRetention (QUILL_KEY_RETENTION), default 720h: an effect older
	// than it may have lost its operation record.
	KeyRetention time.Duration
	// OutboxRetention (QUILL_OUTBOX_RETENTION), default 168h: an effect
	// older than it may have lost its (published) outbox event.
	OutboxRetention time.Duration
	// InboxRetention (QUILL_INBOX_RETENTION), default 336h: an event older
	// than it may have lost its inbox row.
	InboxRetention time.Duration
	// PendingThreshold: an unpublished, unparked event older than it is an
	// anomaly. Default 1m.
	PendingThreshold time.Duration
	// ProcessThreshold: a note.created event with a pending attachment,
	// published longer ago than it and absent from the inbox, is an anomaly.
	// Default 5m.
	ProcessThreshold time.Duration
	// HorizonMargin is subtracted from every retention horizon, for clock
	// skew between the hosts that wrote the timestamps and the cleanup.
	// Default 1m.
	HorizonMargin time.Duration
	// AllChains reports every operation's chain; by default only the
	// chains of a key audit and of operations with an anomaly.
	AllChains bool
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	c.Consumer = cmp.Or(c.Consumer, DefaultConsumer)
	c.ResponseRetention = cmp.Or(c.ResponseRetention, DefaultResponseRetention)
	c.KeyRetention = cmp.Or(c.KeyRetention, DefaultKeyRetention)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, retention.DefaultOutboxRetention)
	c.InboxRetention = cmp.Or(c.InboxRetention, retention.DefaultInboxRetention)
	c.PendingThreshold = cmp.Or(c.PendingThreshold, DefaultPendingThreshold)
	c.ProcessThreshold = cmp.Or(c.ProcessThreshold, DefaultProcessThreshold)
	c.HorizonMargin = cmp.Or(c.HorizonMargin, DefaultHorizonMargin)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate returns an error naming the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Key != "" && c.Tenant == "":
		return errors.New("a key is scoped by its tenant: --key needs --tenant")
	case c.KeyRetention < c.ResponseRetention:
		return fmt.Errorf("key retention %s must be at least the response retention %s", c.KeyRetention, c.ResponseRetention)
	case c.PendingThreshold < 0 || c.ProcessThreshold < 0 || c.HorizonMargin < 0:
		return errors.New("thresholds and the horizon margin must not be negative")
	}
	return nil
}

// Anomaly kinds.
const (
	// KindOrphanEffect: a note, a deletion, an attachment or an outbox
	// event whose operation record is missing although the key retention
	// cannot explain it; an event written under a key whose record is of
	// another action (a note.updated under a create-note's key); or an
	// event about a note that does not exist.
	KindOrphanEffect = "orphan_effect"
	// KindMissingEffect: an operation record (or a processed attachment)
	// whose effect or event is missing although no retention explains it:
	// a create without its note.created, an update recorded as updated
	// without its note.updated, a delete without its note.deleted.
	KindMissingEffect = "missing_effect"
	// KindChainMismatch: an operation's event is about another note than
	// the one its record names, or carries another version than the one
	// the record says the operation left (operations.resource_version).
	KindChainMismatch = "chain_mismatch"
	// KindUnexpectedEvent: an event written under the key of an operation
	// whose outcome changed nothing — an update recorded as unchanged, a
	// write refused for another version (412), one that found no note
	// (404) — and so has no event.
	KindUnexpectedEvent = "unexpected_event"
	// KindDuplicateVersion: two events of one note carry one version: two
	// changes were accepted against one version, or one change was
	// written twice under two ids.
	KindDuplicateVersion = "duplicate_version"
	// KindVersionGap: a note's versions do not add up: a version between
	// 1 and the note's version has no event although the outbox retention
	// cannot explain it (the note's version ahead of its events included),
	// or an event carries a version the note never reached.
	KindVersionGap = "version_gap"
	// KindPending: an event unpublished for longer than the threshold.
	KindPending = "pending"
	// KindParked: an event the relay set aside as unpublishable.
	KindParked = "parked"
	// KindUnqueued: an unpublished event with no row in the relays' queue
	// (outbox_pending): no relay would ever publish it. The queue's
	// triggers keep this from happening unless they were bypassed (a write
	// with session_replication_role = replica, a restore without
	// triggers); "relay events retry ID" queues it again.
	KindUnqueued = "unqueued"
	// KindUnprocessed: a published note.created event whose attachment is
	// still pending, with no inbox row, after the threshold.
	KindUnprocessed = "unprocessed"
	// KindDeadLetter: an event the worker gave up on, not yet re-driven.
	KindDeadLetter = "dead_letter"
	// KindDuplicateNote: two notes created for one operation.
	KindDuplicateNote = "duplicate_note"
	// KindDuplicateEvent: two events of one type written for one operation.
	KindDuplicateEvent = "duplicate_event"
	// KindDuplicateProcessed: two attachment.processed events for one
	// attachment.
	KindDuplicateProcessed = "duplicate_processed_event"
	// KindDuplicateStreamMessage: the stream holds two messages with one
	// event id (Nats-Msg-Id).
	KindDuplicateStreamMessage = "duplicate_stream_message"
	// KindStreamMismatch: an event marked published whose stream sequence
	// holds another message.
	KindStreamMismatch = "stream_mismatch"
	// KindStreamMissing: an event marked published whose stream sequence
	// holds nothing although the stream's MaxAge cannot explain it.
	KindStreamMissing = "stream_missing"
	// KindLostEvent: the stream holds an event, published within the
	// outbox retention, that the database has neither as an outbox row
	// nor among an operation's cleaned events: the transaction that wrote
	// it is gone — a failover to a standby that had not received it, a
	// restore to an earlier point — while consumers may have applied it.
	KindLostEvent = "lost_event"
)

// Anomaly is one finding. Tenant, Key, EventID and Detail are always
// present (empty when they do not apply).
type Anomaly struct {
	Kind         string `json:"kind"`
	Tenant       string `json:"tenant"`
	Key          string `json:"key"`
	EventID      string `json:"event_id"`
	NoteID       string `json:"note_id,omitempty"`
	AttachmentID string `json:"attachment_id,omitempty"`
	StreamSeq    *int64 `json:"stream_seq,omitempty"`
	Detail       string `json:"detail"`
}

// Report is an audit's outcome.
type Report struct {
	Scope     Scope      `json:"scope"`
	Horizons  Horizons   `json:"horizons"`
	Anomalies []Anomaly  `json:"anomalies"`
	Counts    Counts     `json:"counts"`
	Stream    StreamInfo `json:"stream"`
	Chains    []Chain    `json:"chains"`
	// Notes are remarks about the audit itself: checks skipped and why.
	Notes []string `json:"notes"`
}

// Complete reports whether every check ran, the stream's included.
func (r *Report) Complete() bool { return r.Stream.Checked }

// Scope says what was audited and when.
type Scope struct {
	Tenant string `json:"tenant,omitempty"`
	Key    string `json:"key,omitempty"`
	// Found is false for a key audit that found neither a record nor an
	// effect of the key.
	Found bool   `json:"found"`
	At    string `json:"at"`
}

// Horizons are the retentions and thresholds the audit applied.
type Horizons struct {
	ResponseRetention string `json:"response_retention"`
	KeyRetention      string `json:"key_retention"`
	OutboxRetention   string `json:"outbox_retention"`
	InboxRetention    string `json:"inbox_retention"`
	StreamMaxAge      string `json:"stream_max_age,omitempty"`
	PendingThreshold  string `json:"pending_threshold"`
	ProcessThreshold  string `json:"process_threshold"`
	Margin            string `json:"margin"`
}

// Counts keeps requests, business effects and replays apart, with the
// duplicates each layer suppressed.
type Counts struct {
	// Operations is the number of operation records (tombstones included);
	// records past the key retention are gone and not counted.
	Operations int64            `json:"operations"`
	ByAction   map[string]int64 `json:"operations_by_action"`
	Tombstones int64            `json:"tombstones"`
	// Requests is the write requests answered with an outcome: one
	// execution per operation plus its replays.
	Requests int64 `json:"requests"`
	// Replays is the requests answered from a recorded outcome
	// (operations.replays).
	Replays         int64           `json:"replays"`
	BusinessEffects BusinessEffects `json:"business_effects"`
	Events          EventCounts     `json:"events"`
	Inbox           InboxCounts     `json:"inbox"`
	// DuplicatesSuppressed counts, per layer, the duplicates that had no
	// second effect.
	DuplicatesSuppressed Suppressed `json:"duplicates_suppressed"`
	// DuplicatesFound is the duplicate anomalies: duplicates that did.
	DuplicatesFound int64 `json:"duplicates_found"`
}

// BusinessEffects are the effects in the database, whatever their records.
type BusinessEffects struct {
	NotesCreated int64 `json:"notes_created"`
	// NotesUpdated is the updates that changed a note: the versions the
	// notes went through beyond their create and delete.
	NotesUpdated         int64 `json:"notes_updated"`
	NotesDeleted         int64 `json:"notes_deleted"`
	AttachmentsProcessed int64 `json:"attachments_processed"`
	AttachmentsFailed    int64 `json:"attachments_failed"`
	Total                int64 `json:"total"`
}

// EventCounts are the outbox's events (published ones until the outbox
// retention deletes them).
type EventCounts struct {
	Total     int64            `json:"total"`
	Pending   int64            `json:"pending"`
	Published int64            `json:"published"`
	Parked    int64            `json:"parked"`
	ByType    map[string]int64 `json:"by_type"`
}

// InboxCounts are the worker's inbox: for a whole audit all of its rows, for
// a tenant or key audit the rows of the scope's events still in the outbox.
type InboxCounts struct {
	Rows       int64  `json:"rows"`
	Deliveries *int64 `json:"deliveries"`
}

// Suppressed is the duplicates each layer absorbed.
type Suppressed struct {
	// APIReplays: retries answered with the recorded outcome.
	APIReplays int64 `json:"api_replays"`
	// RelayDuplicateAcks: republished events JetStream dropped within its
	// duplicate window (outbox_events.ack_duplicate).
	RelayDuplicateAcks *int64 `json:"relay_duplicate_acks"`
	// InboxDuplicates: redeliveries the worker's inbox recognised
	// (inbox.duplicates).
	InboxDuplicates *int64 `json:"inbox_duplicates"`
	// Total of the layers that can tell.
	Total int64 `json:"total"`
}

// StreamInfo says whether and how the stream was checked.
type StreamInfo struct {
	Name    string `json:"name"`
	Checked bool   `json:"checked"`
	// Reason says why the stream was not (fully) checked.
	Reason string `json:"reason,omitempty"`
	// Verified: published events whose stream sequence holds them.
	Verified int64 `json:"verified"`
	// AgedOut: published events whose message the stream's MaxAge removed.
	AgedOut int64 `json:"aged_out"`
	// Scanned: messages read to look for duplicate event ids.
	Scanned  int64  `json:"scanned"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
}

// Chain is one operation and what became of it.
type Chain struct {
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	Action string `json:"action,omitempty"`
	State  string `json:"state"` // completed, tombstone, missing
	// Outcome is what the record says the operation did: created,
	// updated, unchanged, deleted, nothing_to_update, nothing_to_delete,
	// version_mismatch.
	Outcome string `json:"outcome,omitempty"`
	Status  int    `json:"status,omitzero"`
	// Version is the note version the operation left
	// (operations.resource_version): 1 for a create, the version an
	// update made (an unchanged update: the one it found), the version a
	// delete made. Absent for a 404, a 412 and records written before
	// versions.
	Version int `json:"version,omitzero"`
	// CurrentVersion is a 412's: the note's version when If-Match named
	// another, as its recorded response says (absent from a tombstone).
	CurrentVersion int     `json:"current_version,omitzero"`
	Resource       string  `json:"resource,omitempty"`
	CreatedAt      *string `json:"created_at,omitempty"`
	CompletedAt    *string `json:"completed_at,omitempty"`
	ExpiresAt      *string `json:"expires_at,omitempty"`
	ForgetAt       *string `json:"forget_at,omitempty"`
	Replays        int64   `json:"replays"`
	// Note is the note the operation acted on, Attachment its attachment.
	Notes      []ChainNote      `json:"notes"`
	Attachment *ChainAttachment `json:"attachment,omitempty"`
	Events     []ChainEvent     `json:"events"`
	// Anomalies are the kinds found on this chain.
	Anomalies []string `json:"anomalies"`
}

// ChainNote is a note in a chain.
type ChainNote struct {
	ID        string  `json:"id"`
	CreatedAt string  `json:"created_at"`
	DeletedAt *string `json:"deleted_at,omitempty"`
	// Version is the note's version now (notes.version), UpdatedAt when
	// an update last changed it (absent for a note never updated).
	Version   int     `json:"version"`
	UpdatedAt *string `json:"updated_at,omitempty"`
	// Versions is the note's version history, oldest first: in a key
	// audit, and in any audit for a note with a version anomaly.
	Versions []ChainVersion `json:"versions,omitempty"`
}

// ChainVersion is one version of a note and the event that carries it.
type ChainVersion struct {
	Version int `json:"version"`
	// Type and EventID are the event's; empty when it has none.
	Type    string `json:"type,omitempty"`
	EventID string `json:"event_id,omitempty"`
	// Key is the operation that made the version, as its event or its
	// record names it.
	Key string `json:"key,omitempty"`
	// State is the event's (pending, published, parked); cleaned when the
	// outbox cleanup deleted it and the operation record keeps it; gone
	// when there is no event and the outbox retention explains it;
	// missing when nothing explains it (a version_gap).
	State     string `json:"state"`
	CreatedAt string `json:"created_at,omitempty"`
}

// ChainAttachment is an attachment in a chain.
type ChainAttachment struct {
	ID          string  `json:"id"`
	Status      string  `json:"status"`
	Reason      string  `json:"reason,omitempty"`
	ProcessedAt *string `json:"processed_at,omitempty"`
}

// ChainEvent is an outbox event in a chain, with what the stream and the
// inbox say about it.
type ChainEvent struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	NoteID string `json:"note_id"`
	// Version is a note event's data.version (for a cleaned event, the
	// version its record says the operation left); absent for
	// attachment.processed and events written before versions.
	Version      int     `json:"version,omitzero"`
	State        string  `json:"state"` // pending, published, parked
	CreatedAt    string  `json:"created_at"`
	PublishedAt  *string `json:"published_at,omitempty"`
	StreamSeq    *int64  `json:"stream_seq,omitempty"`
	AckDuplicate *bool   `json:"ack_duplicate,omitempty"`
	// Stream: ok, aged_out, missing, mismatch or unchecked.
	Stream string `json:"stream,omitempty"`
	// Cleaned: the cleanup deleted its outbox row after the outbox
	// retention; the operation record kept it (id, type, publication,
	// stream sequence), so the chain still shows it. Not compared with
	// the stream.
	Cleaned bool `json:"cleaned,omitempty"`
	// Inbox is the worker's row for a note.created event.
	Inbox *ChainInbox `json:"inbox,omitempty"`
}

// ChainInbox is the inbox row of an event.
type ChainInbox struct {
	ProcessedAt string `json:"processed_at"`
	Deliveries  *int64 `json:"deliveries,omitempty"`
	Duplicates  *int64 `json:"duplicates,omitempty"`
}

// TimeFormat is how the report writes times.
const TimeFormat = "2006-01-02T15:04:05.000000Z"

func ftime(t time.Time) string { return t.UTC().Format(TimeFormat) }

func ptime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := ftime(*t)
	return &s
}

// Run audits the database behind pool and, when js is not nil, the stream.
// notChecked, when js is nil, says why the stream is not checked (NATS not
// configured or not reachable); the report says so and Complete is false.
// Errors are operational (the database could not be read, or the stream
// failed in a way other than being unreachable) and wrapped; the audit reads
// the schema that the embedded migrations define, and returns
// ErrSchemaVersion, naming both versions, for a database not migrated to
// the latest of them.
func Run(ctx context.Context, pool db.Beginner, js jetstream.JetStream, notChecked string, cfg Config) (*Report, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	now := cfg.Now().UTC()
	var ds *dataset
	err := db.WithSnapshot(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ds, err = load(ctx, tx, cfg)
		return err
	})
	if err != nil {
		return nil, err
	}
	a := &auditor{cfg: cfg, now: now, ds: ds, rep: &Report{
		Scope: Scope{Tenant: cfg.Tenant, Key: cfg.Key, Found: true, At: ftime(now)},
		Horizons: Horizons{ResponseRetention: cfg.ResponseRetention.String(), KeyRetention: cfg.KeyRetention.String(),
			OutboxRetention: cfg.OutboxRetention.String(), InboxRetention: cfg.InboxRetention.String(),
			PendingThreshold: cfg.PendingThreshold.String(), ProcessThreshold: cfg.ProcessThreshold.String(),
			Margin: cfg.HorizonMargin.String()},
		Anomalies: []Anomaly{}, Chains: []Chain{}, Notes: []string{},
		Stream: StreamInfo{Name: cfg.Stream.Name},
	}}
	if cfg.Key != "" && len(ds.ops) == 0 && len(ds.events) == 0 && len(ds.notes) == 0 {
		a.rep.Scope.Found = false
		a.note(fmt.Sprintf("nothing is recorded for key %q of tenant %q: no operation record (never executed, or forgotten after the key retention of %s) and no event", cfg.Key, cfg.Tenant, cfg.KeyRetention))
	}
	a.index()
	a.checkOperations()
	a.checkNotes()
	a.checkEvents()
	a.checkVersions()
	a.checkDeadLetters()
	if js != nil {
		if err := a.checkStream(ctx, js); err != nil {
			return nil, err
		}
	} else {
		a.rep.Stream.Reason = notChecked
		a.note("stream not checked: " + notChecked + "; published events were not compared with the stream and duplicate messages were not looked for")
	}
	for _, e := range ds.events {
		if e.stream == "" && e.PublishedAt != nil {
			e.stream = "unchecked"
		}
	}
	a.count()
	a.chains()
	return a.rep, nil
}

type noteKey struct {
	tenant string
	id     uuid.UUID
}

type opKey struct{ tenant, key string }

// auditor holds one audit's data, indexes and findings.
type auditor struct {
	cfg Config
	now time.Time
	ds  *dataset
	rep *Report

	opsByKey     map[opKey]*opRow
	createOf     map[noteKey]*opRow   // the create-note record of a note
	deletesOf    map[noteKey][]*opRow // successful delete-note records of a note
	eventsByKey  map[opKey][]*eventRow
	eventsByNote map[uuid.UUID][]*eventRow
	createdKey   map[uuid.UUID]string // note → key of its note.created event
	// madeBy are the records of the operations that made a version of a
	// note (created, updated, deleted), with the version they left.
	madeBy map[noteKey][]*opRow
	// history is each note's version history (checkVersions).
	history map[uuid.UUID][]ChainVersion
	// versionFlagged: notes with a version anomaly.
	versionFlagged map[uuid.UUID]bool
	flagged        map[opKey]bool
	eventFlagged   map[uuid.UUID][]string
	deadByEvent    map[string]*deadRow
}

func (a *auditor) note(s string) { a.rep.Notes = append(a.rep.Notes, s) }

func (a *auditor) add(x Anomaly) {
	a.rep.Anomalies = append(a.rep.Anomalies, x)
	if x.Key != "" {
		k := opKey{x.Tenant, x.Key}
		a.flagged[k] = true
	}
	if x.EventID != "" {
		if id, err := uuid.Parse(x.EventID); err == nil {
			a.eventFlagged[id] = append(a.eventFlagged[id], x.Kind)
		}
	}
}

// within reports whether t is younger than the retention horizon less the
// margin: a record that retention removes after t+retention must still
// exist.
func (a *auditor) within(t time.Time, retention time.Duration) bool {
	return t.After(a.now.Add(-retention + a.cfg.HorizonMargin))
}

func (a *auditor) index() {
	a.opsByKey = map[opKey]*opRow{}
	a.createOf = map[noteKey]*opRow{}
	a.deletesOf = map[noteKey][]*opRow{}
	a.eventsByKey = map[opKey][]*eventRow{}
	a.eventsByNote = map[uuid.UUID][]*eventRow{}
	a.createdKey = map[uuid.UUID]string{}
	a.madeBy = map[noteKey][]*opRow{}
	a.history = map[uuid.UUID][]ChainVersion{}
	a.versionFlagged = map[uuid.UUID]bool{}
	a.flagged = map[opKey]bool{}
	a.eventFlagged = map[uuid.UUID][]string{}
	for _, o := range a.ds.ops {
		a.opsByKey[opKey{o.Tenant, o.Key}] = o
		id, ok := o.noteID()
		if !ok {
			continue
		}
		switch {
		case o.Action == contract.ActionCreateNote && o.Status == 201:
			a.createOf[noteKey{o.Tenant, id}] = o
		case o.Action == contract.ActionDeleteNote && o.Status == 200:
			a.deletesOf[noteKey{o.Tenant, id}] = append(a.deletesOf[noteKey{o.Tenant, id}], o)
		}
		if madeType(o) != "" && o.ResourceVersion > 0 {
			a.madeBy[noteKey{o.Tenant, id}] = append(a.madeBy[noteKey{o.Tenant, id}], o)
		}
	}
	for _, e := range a.ds.events {
		if e.OpKey != "" {
			k := opKey{e.Tenant, e.OpKey}
			a.eventsByKey[k] = append(a.eventsByKey[k], e)
		}
		a.eventsByNote[e.AggregateID] = append(a.eventsByNote[e.AggregateID], e)
		if e.Type == contract.EventNoteCreated && e.OpKey != "" {
			a.createdKey[e.AggregateID] = e.OpKey
		}
	}
}

// Outcomes of the operation records the audit tells apart (the notes
// service's, internal/notes).
const (
	outcomeCreated   = "created"
	outcomeUpdated   = "updated"
	outcomeUnchanged = "unchanged"
	outcomeDeleted   = "deleted"
)

// madeType is the type of the event that operation o's outcome writes with
// the version it makes: note.created, note.updated or note.deleted; "" for
// an outcome that changes nothing (unchanged, a 404, a 412) and so writes
// no event.
func madeType(o *opRow) string {
	switch {
	case o.Action == contract.ActionCreateNote && o.Outcome == outcomeCreated:
		return contract.EventNoteCreated
	case o.Action == contract.ActionUpdateNote && o.Outcome == outcomeUpdated:
		return contract.EventNoteUpdated
	case o.Action == contract.ActionDeleteNote && o.Outcome == outcomeDeleted:
		return contract.EventNoteDeleted
	}
	return ""
}

// writesNothing reports whether o's outcome is one that changes nothing,
// and so has no event: an unchanged update, a write that found no note, one
// refused for another version.
func writesNothing(o *opRow) bool {
	switch o.Outcome {
	case outcomeUnchanged, "nothing_to_update", "nothing_to_delete", "version_mismatch":
		return true
	}
	return false
}

// opEvents returns the events of o's incarnation of its key: those written
// at or after it was created (a key forgotten and executed again has older
// events of its earlier operation).
func (a *auditor) opEvents(o *opRow, typ string) []*eventRow {
	var out []*eventRow
	for _, e := range a.eventsByKey[opKey{o.Tenant, o.Key}] {
		if !e.CreatedAt.Before(o.CreatedAt) && (typ == "" || e.Type == typ) {
			out = append(out, e)
		}
	}
	return out
}

// keyOfNote returns the operation key that created note id, if known.
func (a *auditor) keyOfNote(tenant string, id uuid.UUID) string {
	if o := a.createOf[noteKey{tenant, id}]; o != nil {
		return o.Key
	}
	return a.createdKey[id]
}

func (a *auditor) checkOperations() {
	for _, o := range a.ds.ops {
		id, ok := o.noteID()
		base := Anomaly{Tenant: o.Tenant, Key: o.Key}
		if ok {
			base.NoteID = id.String()
		}
		switch {
		case o.Action == contract.ActionCreateNote && o.Status == 201 && ok:
			if a.ds.notes[id] == nil {
				x := base
				x.Kind, x.Detail = KindMissingEffect, fmt.Sprintf("the operation record says it created note %s, which does not exist (notes are never removed)", id)
				a.add(x)
			}
			a.checkOpEvents(o, id, contract.EventNoteCreated)
		case o.Action == contract.ActionDeleteNote && o.Status == 200 && ok:
			if n := a.ds.notes[id]; n == nil || n.DeletedAt == nil {
				x := base
				x.Kind, x.Detail = KindMissingEffect, fmt.Sprintf("the operation record says it deleted note %s, which is not marked deleted", id)
				a.add(x)
			}
			a.checkOpEvents(o, id, contract.EventNoteDeleted)
		case o.Action == contract.ActionUpdateNote && o.Outcome == outcomeUpdated && ok:
			if a.ds.notes[id] == nil {
				x := base
				x.Kind, x.Detail = KindMissingEffect, fmt.Sprintf("the operation record says it updated note %s to version %d; the note does not exist (notes are never removed)", id, o.ResourceVersion)
				a.add(x)
			}
			a.checkOpEvents(o, id, contract.EventNoteUpdated)
		case isWebhookWrite(o.Action):
			a.checkWebhookOp(o)
		case writesNothing(o):
			for _, e := range a.opEvents(o, "") {
				x := base
				x.Kind, x.EventID = KindUnexpectedEvent, e.ID.String()
				x.Detail = fmt.Sprintf("%s event written under the key of a %s operation recorded as %s (%d), which changes nothing and writes no event",
					e.Type, o.Action, o.Outcome, o.Status)
				a.add(x)
			}
		}
	}
}

// isWebhookWrite reports whether action is a write of the webhook
// endpoints API.
func isWebhookWrite(action string) bool {
	switch action {
	case contract.ActionCreateWebhook, contract.ActionDeleteWebhook, contract.ActionRotateWebhookSecret:
		return true
	}
	return false
}

// Outcomes of the webhook writes the audit checks (internal/webhooks').
const (
	outcomeWebhookCreated = "created"
	outcomeWebhookDeleted = "deleted"
	outcomeWebhookRotated = "rotated"
)

// checkWebhookOp checks a webhook write against the endpoint it names:
// a recorded create's endpoint exists (endpoints are never removed), a
// recorded delete's is marked deleted, a recorded rotation's exists; and
// no webhook write writes an outbox event.
func (a *auditor) checkWebhookOp(o *opRow) {
	base := Anomaly{Tenant: o.Tenant, Key: o.Key}
	for _, e := range a.opEvents(o, "") {
		x := base
		x.Kind, x.EventID = KindUnexpectedEvent, e.ID.String()
		x.Detail = fmt.Sprintf("%s event written under the key of a %s operation, which writes no event", e.Type, o.Action)
		a.add(x)
	}
	id, ok := o.webhookID()
	if !ok {
		return // a refusal (limit reached) names no endpoint
	}
	w := a.ds.hooks[id]
	if w != nil && w.Tenant != o.Tenant {
		w = nil // another tenant's endpoint is not this one's effect
	}
	switch {
	case o.Outcome == outcomeWebhookCreated && w == nil:
		x := base
		x.Kind, x.Detail = KindMissingEffect, fmt.Sprintf("the operation record says it created webhook endpoint %s, which does not exist (endpoints are never removed)", id)
		a.add(x)
	case o.Outcome == outcomeWebhookDeleted && (w == nil || w.DeletedAt == nil):
		x := base
		x.Kind, x.Detail = KindMissingEffect, fmt.Sprintf("the operation record says it deleted webhook endpoint %s, which is not marked deleted", id)
		a.add(x)
	case o.Outcome == outcomeWebhookRotated && w == nil:
		x := base
		x.Kind, x.Detail = KindMissingEffect, fmt.Sprintf("the operation record says it rotated the secret of webhook endpoint %s, which does not exist", id)
		a.add(x)
	}
}

// checkOpEvents checks the events of type typ written by operation o on
// note id: exactly one, about that note — unless the outbox retention may
// have deleted it.
func (a *auditor) checkOpEvents(o *opRow, id uuid.UUID, typ string) {
	evs := a.opEvents(o, typ)
	base := Anomaly{Tenant: o.Tenant, Key: o.Key, NoteID: id.String()}
	switch {
	case len(evs) == 0 && a.within(o.CreatedAt, a.cfg.OutboxRetention):
		x := base
		x.Kind = KindMissingEffect
		x.Detail = fmt.Sprintf("no %s event for the operation, which completed %s ago (within the outbox retention of %s, so it cannot have been cleaned up)",
			typ, a.now.Sub(o.CompletedAt).Round(time.Second), a.cfg.OutboxRetention)
		a.add(x)
	case len(evs) > 1:
		notes := map[uuid.UUID]bool{}
		ids := make([]string, len(evs))
		for i, e := range evs {
			notes[e.AggregateID] = true
			ids[i] = e.ID.String()
		}
		x := base
		x.EventID = evs[1].ID.String()
		if len(notes) > 1 && typ == contract.EventNoteCreated {
			x.Kind = KindDuplicateNote
			x.Detail = fmt.Sprintf("%d notes were created for one operation (events %v)", len(notes), ids)
		} else {
			x.Kind = KindDuplicateEvent
			x.Detail = fmt.Sprintf("%d %s events were written for one operation: %v", len(evs), typ, ids)
		}
		a.add(x)
	}
	for _, e := range evs {
		if len(evs) != 1 {
			continue
		}
		switch {
		case e.AggregateID != id:
			x := base
			x.Kind, x.EventID = KindChainMismatch, e.ID.String()
			x.Detail = fmt.Sprintf("the operation's %s event is about note %s, its record about note %s", typ, e.AggregateID, id)
			a.add(x)
		case e.Version != 0 && o.ResourceVersion != 0 && e.Version != o.ResourceVersion:
			x := base
			x.Kind, x.EventID = KindChainMismatch, e.ID.String()
			x.Detail = fmt.Sprintf("the operation's %s event carries version %d, its record says it left the note at version %d", typ, e.Version, o.ResourceVersion)
			a.add(x)
		}
	}
}

func (a *auditor) checkNotes() {
	ids := make([]uuid.UUID, 0, len(a.ds.notes))
	for id := range a.ds.notes {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(x, y uuid.UUID) int { return bytes.Compare(x[:], y[:]) })
	for _, id := range ids {
		n := a.ds.notes[id]
		nk := noteKey{n.Tenant, id}
		att := a.ds.atts[id]
		base := Anomaly{Tenant: n.Tenant, Key: a.keyOfNote(n.Tenant, id), NoteID: id.String()}
		if a.createOf[nk] == nil && a.within(n.CreatedAt, a.cfg.KeyRetention) {
			x := base
			x.Kind = KindOrphanEffect
			x.Detail = fmt.Sprintf("note created %s ago has no create-note operation record (within the key retention of %s, so it cannot have been forgotten)",
				a.now.Sub(n.CreatedAt).Round(time.Second), a.cfg.KeyRetention)
			a.add(x)
			if att != nil {
				x := base
				x.Kind, x.AttachmentID = KindOrphanEffect, att.ID.String()
				x.Detail = fmt.Sprintf("attachment of note %s has no create-note operation record", id)
				a.add(x)
			}
		}
		if n.DeletedAt != nil && len(a.deletesOf[nk]) == 0 && a.within(*n.DeletedAt, a.cfg.KeyRetention) {
			x := base // named by the note's create key unless a note.deleted event names one
			if evs := a.eventsOfNote(id, contract.EventNoteDeleted); len(evs) > 0 {
				x.Key, x.EventID = evs[0].OpKey, evs[0].ID.String()
			}
			x.Kind = KindOrphanEffect
			x.Detail = fmt.Sprintf("note deleted %s ago has no delete-note operation record (within the key retention of %s)",
				a.now.Sub(*n.DeletedAt).Round(time.Second), a.cfg.KeyRetention)
			a.add(x)
		}
		if att == nil {
			continue
		}
		switch {
		case att.Status != "pending" && att.ProcessedAt != nil:
			evs := a.eventsOfNote(id, contract.EventAttachmentProcessed)
			if len(evs) == 0 && a.within(*att.ProcessedAt, a.cfg.OutboxRetention) {
				x := base
				x.Kind, x.AttachmentID = KindMissingEffect, att.ID.String()
				x.Detail = fmt.Sprintf("attachment %s %s ago but no attachment.processed event (within the outbox retention of %s)",
					att.Status, a.now.Sub(*att.ProcessedAt).Round(time.Second), a.cfg.OutboxRetention)
				a.add(x)
			}
			if len(evs) > 1 {
				ids := make([]string, len(evs))
				for i, e := range evs {
					ids[i] = e.ID.String()
				}
				x := base
				x.Kind, x.AttachmentID, x.EventID = KindDuplicateProcessed, att.ID.String(), evs[1].ID.String()
				x.Detail = fmt.Sprintf("%d attachment.processed events for one attachment: %v", len(evs), ids)
				a.add(x)
			}
		case att.Status == "pending" && att.Reason == nil:
			// The note.created event left the outbox (published, then
			// cleaned up) long ago and the attachment is still pending.
			if len(a.eventsOfNote(id, contract.EventNoteCreated)) == 0 && !a.within(n.CreatedAt, a.cfg.OutboxRetention) {
				x := base
				x.Kind, x.AttachmentID = KindUnprocessed, att.ID.String()
				x.Detail = fmt.Sprintf("attachment still pending %s after its note was created; its note.created event has left the outbox (retention %s)",
					a.now.Sub(n.CreatedAt).Round(time.Second), a.cfg.OutboxRetention)
				a.add(x)
			}
		}
	}
}

func (a *auditor) eventsOfNote(id uuid.UUID, typ string) []*eventRow {
	var out []*eventRow
	for _, e := range a.eventsByNote[id] {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

func (a *auditor) openDeadLetter(id uuid.UUID) *deadRow {
	if a.deadByEvent == nil {
		a.deadByEvent = map[string]*deadRow{}
		for _, d := range a.ds.dead {
			a.deadByEvent[d.EventID] = d
		}
	}
	return a.deadByEvent[id.String()]
}

func (a *auditor) checkEvents() {
	for _, e := range a.ds.events {
		key := e.OpKey
		if key == "" {
			key = a.keyOfNote(e.Tenant, e.AggregateID)
		}
		base := Anomaly{Tenant: e.Tenant, Key: key, EventID: e.ID.String(), NoteID: e.AggregateID.String()}
		if e.OpKey != "" {
			o := a.opsByKey[opKey{e.Tenant, e.OpKey}]
			switch {
			case (o == nil || o.CreatedAt.After(e.CreatedAt)) && a.within(e.CreatedAt, a.cfg.KeyRetention):
				x := base
				x.Kind = KindOrphanEffect
				x.Detail = fmt.Sprintf("%s event written %s ago has no operation record for its key (within the key retention of %s)",
					e.Type, a.now.Sub(e.CreatedAt).Round(time.Second), a.cfg.KeyRetention)
				a.add(x)
			case o != nil && !o.CreatedAt.After(e.CreatedAt) && eventAction[e.Type] != "" && o.Action != eventAction[e.Type]:
				// The worker's attachment.processed is written under the
				// create's key: a create-note's, as its note.created.
				x := base
				x.Kind = KindOrphanEffect
				x.Detail = fmt.Sprintf("%s event written under the key of a %s operation: no %s operation record accounts for it",
					e.Type, o.Action, eventAction[e.Type])
				a.add(x)
			}
		}
		if a.ds.notes[e.AggregateID] == nil && (a.cfg.Key == "" || e.OpKey == a.cfg.Key || e.OpKey == "") {
			x := base
			x.Kind = KindOrphanEffect
			x.Detail = fmt.Sprintf("%s event is about note %s, which does not exist", e.Type, e.AggregateID)
			a.add(x)
		}
		if e.PublishedAt == nil && e.Queued != nil && !*e.Queued {
			x := base
			x.Kind = KindUnqueued
			x.Detail = fmt.Sprintf("%s event is unpublished but not in the relays' queue (outbox_pending), so no relay will publish it (queue it with \"relay events retry %s\")",
				e.Type, e.ID)
			a.add(x)
		}
		switch {
		case e.PublishedAt == nil && e.ParkedAt != nil:
			x := base
			x.Kind = KindParked
			x.Detail = fmt.Sprintf("%s event parked %s ago after %d attempts: %s (retry with \"relay events retry %s\" once fixed)",
				e.Type, a.now.Sub(*e.ParkedAt).Round(time.Second), e.Attempts, deref(e.ParkedReason), e.ID)
			a.add(x)
		case e.PublishedAt == nil && !e.CreatedAt.After(a.now.Add(-a.cfg.PendingThreshold)):
			x := base
			x.Kind = KindPending
			x.Detail = fmt.Sprintf("%s event unpublished for %s (threshold %s), %d attempts", e.Type,
				a.now.Sub(e.CreatedAt).Round(time.Second), a.cfg.PendingThreshold, e.Attempts)
			if e.LastError != nil {
				x.Detail += ", last error: " + *e.LastError
			}
			a.add(x)
		}
		if e.Type == contract.EventNoteCreated && e.PublishedAt != nil {
			att := a.ds.atts[e.AggregateID]
			if att == nil || att.Status != "pending" || att.Reason != nil || a.ds.inbox[e.ID] != nil {
				continue
			}
			if e.PublishedAt.After(a.now.Add(-a.cfg.ProcessThreshold)) {
				continue
			}
			x := base
			x.AttachmentID = att.ID.String()
			if d := a.openDeadLetter(e.ID); d != nil {
				continue // reported by checkDeadLetters
			}
			x.Kind = KindUnprocessed
			x.Detail = fmt.Sprintf("note.created event published %s ago (threshold %s) has no inbox row for consumer %s and its attachment is still pending",
				a.now.Sub(*e.PublishedAt).Round(time.Second), a.cfg.ProcessThreshold, a.cfg.Consumer)
			a.add(x)
		}
	}
}

// eventAction is the action whose operation writes each event type under
// its key; the worker writes attachment.processed under the create's.
var eventAction = map[string]string{
	contract.EventNoteCreated:         contract.ActionCreateNote,
	contract.EventNoteUpdated:         contract.ActionUpdateNote,
	contract.EventNoteDeleted:         contract.ActionDeleteNote,
	contract.EventAttachmentProcessed: contract.ActionCreateNote,
}

// versionEntry is one event carrying a version of a note: in the outbox
// (ev), or cleaned from it and kept by the record that made the version
// (op).
type versionEntry struct {
	version int
	ev      *eventRow
	op      *opRow
	cleaned cleanedEvent
}

func (v versionEntry) key() string {
	if v.ev != nil {
		return v.ev.OpKey
	}
	return v.op.Key
}

func (v versionEntry) id() string {
	if v.ev != nil {
		return v.ev.ID.String()
	}
	return v.cleaned.ID.String()
}

// noteVersions returns the events carrying note n's versions, by version:
// those in the outbox with their data.version (a note.created written
// before versions is version 1; a note.deleted written before versions
// carries none, and made none), and those the outbox cleanup deleted that
// the record of the operation that made the version keeps.
func (a *auditor) noteVersions(n *noteRow) map[int][]versionEntry {
	byVersion := map[int][]versionEntry{}
	for _, e := range a.eventsByNote[n.ID] {
		if e.Tenant != n.Tenant || eventAction[e.Type] == "" || e.Type == contract.EventAttachmentProcessed {
			continue
		}
		v := e.Version
		if v == 0 && e.Type == contract.EventNoteCreated {
			v = 1
		}
		if v == 0 {
			continue
		}
		byVersion[v] = append(byVersion[v], versionEntry{version: v, ev: e})
	}
	for _, o := range a.madeBy[noteKey{n.Tenant, n.ID}] {
		typ := madeType(o)
		if len(a.opEvents(o, typ)) > 0 {
			continue
		}
		for _, k := range o.Cleaned {
			if k.Type == typ {
				v := o.ResourceVersion
				byVersion[v] = append(byVersion[v], versionEntry{version: v, op: o, cleaned: k})
				break
			}
		}
	}
	return byVersion
}

// checkVersions checks each note's version history: every version from 1 to
// the note's version is carried by exactly one event, unless the outbox
// retention explains its absence — the event just below the gap (or the
// note's create, when there is none) is older than the retention, or was
// itself cleaned, so the missing event may have been cleaned too. Its
// findings are the history each chain of the note shows.
func (a *auditor) checkVersions() {
	ids := make([]uuid.UUID, 0, len(a.ds.notes))
	for id := range a.ds.notes {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(x, y uuid.UUID) int { return bytes.Compare(x[:], y[:]) })
	for _, id := range ids {
		a.checkNoteVersions(a.ds.notes[id])
	}
}

func (a *auditor) checkNoteVersions(n *noteRow) {
	byVersion := a.noteVersions(n)
	top := 0
	for v := range byVersion {
		top = max(top, v)
	}
	last := top // the highest version an event carries
	top = max(top, n.Version)
	createKey := a.keyOfNote(n.Tenant, n.ID)
	base := Anomaly{Tenant: n.Tenant, Key: createKey, NoteID: n.ID.String()}
	flag := func(x Anomaly) {
		a.versionFlagged[n.ID] = true
		a.add(x)
	}
	// madeKey is the key of the operation whose record says it made
	// each version.
	madeKey := map[int]string{}
	for _, o := range a.madeBy[noteKey{n.Tenant, n.ID}] {
		madeKey[o.ResourceVersion] = o.Key
	}
	var hist []ChainVersion
	// lower is what the version below the one being looked at tells about
	// its time: the event's commit time, or the note's create.
	lower, lowerCleaned := n.CreatedAt, false
	for v := 1; v <= top; v++ {
		entries := byVersion[v]
		if len(entries) == 0 {
			start := v
			for v+1 <= top && len(byVersion[v+1]) == 0 {
				v++
			}
			state := "gone"
			if !lowerCleaned && a.within(lower, a.cfg.OutboxRetention) {
				state = "missing"
				x := base
				if k := madeKey[start]; k != "" {
					x.Key = k
				}
				x.Kind = KindVersionGap
				what := fmt.Sprintf("version %d has", start)
				if v > start {
					what = fmt.Sprintf("versions %d–%d have", start, v)
				}
				if start > last {
					x.Detail = fmt.Sprintf("note %s is at version %d but its events stop at version %d: %s no event, and the version below was made %s ago (within the outbox retention of %s, so no cleanup removed it)",
						n.ID, n.Version, last, what, a.now.Sub(lower).Round(time.Second), a.cfg.OutboxRetention)
				} else {
					x.Detail = fmt.Sprintf("note %s (at version %d): %s no event, and the version below was made %s ago (within the outbox retention of %s, so no cleanup removed it)",
						n.ID, n.Version, what, a.now.Sub(lower).Round(time.Second), a.cfg.OutboxRetention)
				}
				flag(x)
			}
			for g := start; g <= v; g++ {
				hist = append(hist, ChainVersion{Version: g, Key: madeKey[g], State: state})
			}
			continue
		}
		for _, e := range entries {
			cv := ChainVersion{Version: v, EventID: e.id(), Key: e.key()}
			if e.ev != nil {
				cv.Type, cv.State, cv.CreatedAt = e.ev.Type, eventState(e.ev), ftime(e.ev.CreatedAt)
				lower, lowerCleaned = e.ev.CreatedAt, false
			} else {
				cv.Type, cv.State = e.cleaned.Type, "cleaned"
				lowerCleaned = true
			}
			hist = append(hist, cv)
		}
		if len(entries) > 1 {
			var what []string
			for _, e := range entries {
				what = append(what, fmt.Sprintf("%s %s (key %q)", e.id(), entryType(e), e.key()))
			}
			x := base
			x.Kind, x.Key, x.EventID = KindDuplicateVersion, entries[1].key(), entries[1].id()
			x.Detail = fmt.Sprintf("%d events of note %s carry version %d: %s", len(entries), n.ID, v, strings.Join(what, ", "))
			flag(x)
		}
	}
	if last > n.Version {
		e := byVersion[last][0]
		x := base
		x.Kind, x.Key, x.EventID = KindVersionGap, e.key(), e.id()
		x.Detail = fmt.Sprintf("%s event of note %s carries version %d, a version the note never reached: it is at version %d", entryType(e), n.ID, last, n.Version)
		flag(x)
	}
	a.history[n.ID] = hist
}

func entryType(e versionEntry) string {
	if e.ev != nil {
		return e.ev.Type
	}
	return e.cleaned.Type
}

// eventState is an outbox event's state: pending, published or parked.
func eventState(e *eventRow) string {
	switch {
	case e.PublishedAt != nil:
		return "published"
	case e.ParkedAt != nil:
		return "parked"
	}
	return "pending"
}

func (a *auditor) checkDeadLetters() {
	byID := map[string]*eventRow{}
	for _, e := range a.ds.events {
		byID[e.ID.String()] = e
	}
	for _, d := range a.ds.dead {
		e := byID[d.EventID]
		if a.cfg.Key != "" && e == nil {
			continue // not this key's
		}
		x := Anomaly{Kind: KindDeadLetter, Tenant: contract.SubjectTenant(a.cfg.Stream.SubjectPrefix, d.Subject), EventID: d.EventID,
			Detail: fmt.Sprintf("dead letter %d after %d deliveries: %s (re-drive with \"attachment-worker dead-letters retry %d\" once fixed)",
				d.ID, d.Deliveries, d.Error, d.ID)}
		if e != nil {
			x.Tenant, x.NoteID = e.Tenant, e.AggregateID.String()
			x.Key = e.OpKey
			if att := a.ds.atts[e.AggregateID]; att != nil {
				x.AttachmentID = att.ID.String()
			}
		}
		a.add(x)
	}
}

func (a *auditor) count() {
	c := &a.rep.Counts
	c.ByAction = map[string]int64{}
	c.Events.ByType = map[string]int64{}
	for _, o := range a.ds.ops {
		if a.cfg.Key != "" && o.Key != a.cfg.Key {
			continue // another key's record about the same note: context only
		}
		c.Operations++
		c.ByAction[o.Action]++
		if o.CompactedAt != nil {
			c.Tombstones++
		}
		c.Replays += o.Replays
	}
	c.Requests = c.Operations + c.Replays
	for _, n := range a.ds.notes {
		c.BusinessEffects.NotesCreated++
		updates := n.Version - 1
		if n.DeletedAt != nil {
			c.BusinessEffects.NotesDeleted++
			// A delete makes a version of its own, except one made
			// before versions (migration 00016), which left version 1.
			updates = max(updates-1, 0)
		}
		c.BusinessEffects.NotesUpdated += int64(updates)
	}
	for _, att := range a.ds.atts {
		switch att.Status {
		case "processed":
			c.BusinessEffects.AttachmentsProcessed++
		case "failed":
			c.BusinessEffects.AttachmentsFailed++
		}
	}
	b := &c.BusinessEffects
	b.Total = b.NotesCreated + b.NotesUpdated + b.NotesDeleted + b.AttachmentsProcessed + b.AttachmentsFailed
	var acks int64
	for _, e := range a.ds.events {
		c.Events.Total++
		c.Events.ByType[e.Type]++
		switch {
		case e.PublishedAt != nil:
			c.Events.Published++
		case e.ParkedAt != nil:
			c.Events.Parked++
		default:
			c.Events.Pending++
		}
		if e.AckDuplicate != nil && *e.AckDuplicate {
			acks++
		}
	}
	c.Inbox = InboxCounts{Rows: a.ds.inboxRows, Deliveries: a.ds.inboxDeliveries}
	s := &c.DuplicatesSuppressed
	s.APIReplays = c.Replays
	s.Total = c.Replays
	s.RelayDuplicateAcks = &acks
	s.Total += acks
	s.InboxDuplicates = a.ds.inboxDuplicates
	s.Total += *a.ds.inboxDuplicates
	for _, x := range a.rep.Anomalies {
		switch x.Kind {
		case KindDuplicateNote, KindDuplicateEvent, KindDuplicateProcessed, KindDuplicateStreamMessage, KindDuplicateVersion:
			c.DuplicatesFound++
		}
	}
}

// chains builds the reported chains: a key audit's key, and otherwise every
// operation with an anomaly (every operation with AllChains), plus the keys
// anomalies name that have no record.
func (a *auditor) chains() {
	want := func(k opKey) bool {
		if a.cfg.Key != "" {
			return k.key == a.cfg.Key
		}
		return a.cfg.AllChains || a.flagged[k]
	}
	seen := map[opKey]bool{}
	for _, o := range a.ds.ops {
		k := opKey{o.Tenant, o.Key}
		if !want(k) {
			continue
		}
		seen[k] = true
		a.rep.Chains = append(a.rep.Chains, a.chain(k, o))
	}
	var missing []opKey
	for k := range a.flagged {
		if !seen[k] && want(k) {
			missing = append(missing, k)
		}
	}
	if a.cfg.Key != "" && !seen[opKey{a.cfg.Tenant, a.cfg.Key}] && !a.flagged[opKey{a.cfg.Tenant, a.cfg.Key}] && a.rep.Scope.Found {
		missing = append(missing, opKey{a.cfg.Tenant, a.cfg.Key})
	}
	slices.SortFunc(missing, func(x, y opKey) int {
		if x.tenant != y.tenant {
			return strings.Compare(x.tenant, y.tenant)
		}
		return strings.Compare(x.key, y.key)
	})
	for _, k := range missing {
		a.rep.Chains = append(a.rep.Chains, a.chain(k, nil))
	}
}

func (a *auditor) chain(k opKey, o *opRow) Chain {
	c := Chain{Tenant: k.tenant, Key: k.key, State: "missing", Notes: []ChainNote{}, Events: []ChainEvent{}, Anomalies: []string{}}
	var noteIDs []uuid.UUID
	var evs []*eventRow
	if o != nil {
		c.Action, c.Status, c.Resource, c.Replays = o.Action, o.Status, o.Resource, o.Replays
		c.Outcome, c.Version, c.CurrentVersion = o.Outcome, o.ResourceVersion, o.CurrentVersion
		c.State = contract.OperationCompleted
		if o.CompactedAt != nil {
			c.State = "tombstone"
		}
		c.CreatedAt, c.CompletedAt = ptime(&o.CreatedAt), ptime(&o.CompletedAt)
		c.ExpiresAt, c.ForgetAt = ptime(&o.ExpiresAt), ptime(&o.ForgetAt)
		if id, ok := o.noteID(); ok {
			noteIDs = append(noteIDs, id)
		}
		evs = a.opEvents(o, "")
	} else {
		evs = a.eventsByKey[k]
	}
	for _, e := range evs {
		if !containsUUID(noteIDs, e.AggregateID) {
			noteIDs = append(noteIDs, e.AggregateID)
		}
	}
	if o == nil {
		// An orphan note of this key (known from its event only).
		for id, n := range a.ds.notes {
			if n.Tenant == k.tenant && a.keyOfNote(n.Tenant, id) == k.key && !containsUUID(noteIDs, id) {
				noteIDs = append(noteIDs, id)
			}
		}
	}
	isCreate := o == nil || o.Action == contract.ActionCreateNote
	for _, id := range noteIDs {
		if n := a.ds.notes[id]; n != nil {
			cn := ChainNote{ID: id.String(), CreatedAt: ftime(n.CreatedAt), DeletedAt: ptime(n.DeletedAt), Version: n.Version}
			if n.UpdatedAt != nil && !n.UpdatedAt.Equal(n.CreatedAt) {
				cn.UpdatedAt = ptime(n.UpdatedAt) // a create sets it to created_at
			}
			if a.cfg.Key != "" || a.versionFlagged[id] {
				cn.Versions = a.history[id]
			}
			c.Notes = append(c.Notes, cn)
		}
		if att := a.ds.atts[id]; att != nil && isCreate && c.Attachment == nil {
			c.Attachment = &ChainAttachment{ID: att.ID.String(), Status: att.Status, Reason: deref(att.Reason), ProcessedAt: ptime(att.ProcessedAt)}
		}
		if isCreate {
			evs = append(evs, a.eventsOfNote(id, contract.EventAttachmentProcessed)...)
		}
	}
	slices.SortFunc(evs, func(x, y *eventRow) int { return int(x.Seq - y.Seq) })
	evs = slices.CompactFunc(evs, func(x, y *eventRow) bool { return x.Seq == y.Seq })
	kinds := map[string]bool{}
	if o != nil {
		c.Events = append(c.Events, cleanedChainEvents(o, evs)...)
	}
	for _, e := range evs {
		ce := ChainEvent{ID: e.ID.String(), Type: e.Type, NoteID: e.AggregateID.String(), Version: e.Version, CreatedAt: ftime(e.CreatedAt),
			PublishedAt: ptime(e.PublishedAt), StreamSeq: e.StreamSeq, AckDuplicate: e.AckDuplicate, Stream: e.stream, State: eventState(e)}
		if in := a.ds.inbox[e.ID]; in != nil {
			ce.Inbox = &ChainInbox{ProcessedAt: ftime(in.ProcessedAt), Deliveries: in.Deliveries, Duplicates: in.Duplicates}
		}
		c.Events = append(c.Events, ce)
		for _, kind := range a.eventFlagged[e.ID] {
			kinds[kind] = true
		}
	}
	for _, x := range a.rep.Anomalies {
		if x.Tenant == k.tenant && x.Key == k.key {
			kinds[x.Kind] = true
		}
	}
	for kind := range kinds {
		c.Anomalies = append(c.Anomalies, kind)
	}
	slices.Sort(c.Anomalies)
	return c
}

// cleanedChainEvents are o's events that only its record still knows (the
// cleanup deleted their outbox rows), those not among evs, in outbox order
// — before every event still in the outbox, which are younger. The record
// keeps no commit time for them: CreatedAt is empty.
func cleanedChainEvents(o *opRow, evs []*eventRow) []ChainEvent {
	var out []ChainEvent
	for _, k := range o.Cleaned {
		if slices.ContainsFunc(evs, func(e *eventRow) bool { return e.ID == k.ID }) {
			continue
		}
		note, _ := o.noteID()
		ce := ChainEvent{ID: k.ID.String(), Type: k.Type, NoteID: note.String(), State: "published",
			PublishedAt: ptime(k.PublishedAt), StreamSeq: k.StreamSeq, Stream: "unchecked", Cleaned: true}
		if k.Type == madeType(o) {
			ce.Version = o.ResourceVersion // the version the record says its event carried
		}
		out = append(out, ce)
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
