package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Querier runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrDeadLetterNotFound is returned for a dead letter id the consumer has
// no dead letter with.
var ErrDeadLetterNotFound = errors.New("no dead letter with this id")

// Store is the package's tables of one prefix — the inbox and the dead
// letters of every consumer that keeps them there, each under its
// Durable — for the tools around the consumers: listing, counting and
// re-driving dead letters, cleaning the inbox. A Consumer writes through
// a Store of its own.
type Store struct {
	db  Querier
	t   tables
	sql storeSQL
}

// storeSQL are the statements with the table names substituted (the names
// are validated identifiers, tablesOf, never input).
type storeSQL struct {
	inboxRecord, inboxForget, inboxDeleteBefore, inboxDeleteExpired          string
	deadInsert, deadOpen, deadAll, deadOne, deadCountOpen, deadMarkRetried   string
	deadOpenAny, deadAllAny, deadCountByConsumer                             string
	versionsLock, versionsWrite, versionsDeleteBefore, versionsDeleteExpired string
}

const (
	// One row per event id: record merges the copies of one event (ON
	// CONFLICT DO UPDATE cannot touch a row twice in one statement) and
	// passes the copies merged away as duplicates. On a conflict every
	// copy is a duplicate, counted. xmax is 0 only on a row version this
	// statement inserted. Rows go in event id order, so that two
	// transactions recording the same events wait for each other rather
	// than deadlock; a concurrent transaction inserting the same event
	// makes this one wait for its outcome.
	sqlInboxRecord = `INSERT INTO %[1]s AS i (consumer, event_id, event_type, stream_seq, deliveries, duplicates, processed_at)
	SELECT $1, e.id, e.type, e.seq, e.deliveries, e.duplicates, $7
	FROM unnest($2::uuid[], $3::text[], $4::bigint[], $5::integer[], $6::integer[]) AS e(id, type, seq, deliveries, duplicates)
	ORDER BY e.id
	ON CONFLICT (consumer, event_id) DO UPDATE SET duplicates = i.duplicates + 1 + excluded.duplicates
	RETURNING i.event_id::text, i.xmax = 0`

	sqlInboxForget = `DELETE FROM %[1]s WHERE consumer = $1 AND event_id = ANY($2::uuid[])`

	sqlInboxDeleteBefore = `DELETE FROM %[1]s WHERE (consumer, event_id) IN (
		SELECT consumer, event_id FROM %[1]s WHERE consumer = $1 AND processed_at < $2
		ORDER BY processed_at LIMIT $3 FOR UPDATE SKIP LOCKED)`

	// By the database's clock: every process that cleans agrees on what
	// expired, whatever its own clock says.
	sqlInboxDeleteExpired = `DELETE FROM %[1]s WHERE (consumer, event_id) IN (
		SELECT consumer, event_id FROM %[1]s WHERE processed_at < now() - $1::interval
		ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED)`

	sqlDeadLetterInsert = `INSERT INTO %[1]s
	(consumer, event_id, event_type, subject, stream_seq, deliveries, reason, headers, payload, created_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

	sqlDeadLetterColumns = `id, consumer, event_id, event_type, stream_seq, subject, reason, deliveries, created_at, retried_at, headers, payload`

	// The open ones walk the partial index of migration 00002.
	sqlDeadLettersOpen = `SELECT ` + sqlDeadLetterColumns + ` FROM %[1]s
	WHERE consumer = $1 AND retried_at IS NULL AND id > $2 ORDER BY id LIMIT $3`
	sqlDeadLettersAll = `SELECT ` + sqlDeadLetterColumns + ` FROM %[1]s
	WHERE consumer = $1 AND id > $2 ORDER BY id LIMIT $3`
	// Of every consumer: the open ones are read from the same partial
	// index and sorted, a cost of the open dead letters however many were
	// re-driven.
	sqlDeadLettersOpenAny = `SELECT ` + sqlDeadLetterColumns + ` FROM %[1]s
	WHERE retried_at IS NULL AND id > $1 ORDER BY id LIMIT $2`
	sqlDeadLettersAllAny = `SELECT ` + sqlDeadLetterColumns + ` FROM %[1]s
	WHERE id > $1 ORDER BY id LIMIT $2`
	sqlDeadLetterOne = `SELECT ` + sqlDeadLetterColumns + ` FROM %[1]s WHERE consumer = $1 AND id = $2`

	sqlDeadLettersCountOpen = `SELECT count(*) FROM %[1]s WHERE consumer = $1 AND retried_at IS NULL`

	sqlDeadLettersCountByConsumer = `SELECT consumer, count(*) FROM %[1]s WHERE retried_at IS NULL
	GROUP BY consumer ORDER BY consumer`

	sqlDeadLetterMarkRetried = `UPDATE %[1]s SET retried_at = $2 WHERE id = $1`

	// The version guard's lock: every note's row, inserted at version 0
	// when missing, locked until the transaction ends, so that two
	// transactions of one note decide one after the other. Rows go in key
	// order, so that two transactions of the same notes wait rather than
	// deadlock. The no-op update is what locks an existing row and
	// returns it; xmax is 0 only on a row this statement inserted.
	sqlVersionsLock = `INSERT INTO %[1]s AS v (consumer, tenant, note_id, version, applied_at)
	SELECT $1, k.tenant, k.note_id, 0, $4
	FROM unnest($2::text[], $3::text[]) AS k(tenant, note_id)
	ORDER BY k.tenant, k.note_id
	ON CONFLICT (consumer, tenant, note_id) DO UPDATE SET version = v.version
	RETURNING v.tenant, v.note_id, v.version, v.xmax = 0`

	// After the handler: each note's new version (an upsert onto the rows
	// the lock made or found, through the primary key as its arbiter, row
	// by row: an UPDATE ... FROM unnest join is planned from the table's
	// statistics, and a plan made while the table was small — a hash join
	// over a sequential scan — stays cached on the connection while the
	// table grows; decision 0089), or (version 0) the deletion of the row
	// the lock inserted for a note none of whose events applied.
	sqlVersionsWrite = `WITH u AS (
		SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::boolean[]) AS u(tenant, note_id, version, deleted)
	), gone AS (
		DELETE FROM %[1]s v
		WHERE v.consumer = $1 AND v.version = 0 AND (v.tenant, v.note_id) IN (SELECT tenant, note_id FROM u WHERE u.version = 0)
	)
	INSERT INTO %[1]s AS v (consumer, tenant, note_id, version, deleted, applied_at)
	SELECT $1, u.tenant, u.note_id, u.version, u.deleted, $6 FROM u WHERE u.version > 0 ORDER BY u.tenant, u.note_id
	ON CONFLICT (consumer, tenant, note_id) DO UPDATE SET version = excluded.version, deleted = excluded.deleted, applied_at = excluded.applied_at`

	// Only deleted notes' rows: see DeleteExpiredVersions.
	sqlVersionsDeleteBefore = `DELETE FROM %[1]s WHERE (consumer, tenant, note_id) IN (
		SELECT consumer, tenant, note_id FROM %[1]s WHERE deleted AND consumer = $1 AND applied_at < $2
		ORDER BY applied_at LIMIT $3 FOR UPDATE SKIP LOCKED)`
	sqlVersionsDeleteExpired = `DELETE FROM %[1]s WHERE (consumer, tenant, note_id) IN (
		SELECT consumer, tenant, note_id FROM %[1]s WHERE deleted AND applied_at < now() - $1::interval
		ORDER BY applied_at LIMIT $2 FOR UPDATE SKIP LOCKED)`
)

// NewStore returns the Store of the tables Migrate made with prefix
// (DefaultTablePrefix when ""), reached through db. It returns an error
// for a prefix that is not a lower-case identifier.
func NewStore(db Querier, prefix string) (*Store, error) {
	t, err := tablesOf(cmp.Or(prefix, DefaultTablePrefix))
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	in, dl := func(q string) string { return fmt.Sprintf(q, t.inbox) }, func(q string) string { return fmt.Sprintf(q, t.deadLetters) }
	vs := func(q string) string { return fmt.Sprintf(q, t.versions) }
	return &Store{db: db, t: t, sql: storeSQL{
		inboxRecord: in(sqlInboxRecord), inboxForget: in(sqlInboxForget),
		inboxDeleteBefore: in(sqlInboxDeleteBefore), inboxDeleteExpired: in(sqlInboxDeleteExpired),
		deadInsert: dl(sqlDeadLetterInsert), deadOpen: dl(sqlDeadLettersOpen), deadAll: dl(sqlDeadLettersAll),
		deadOne: dl(sqlDeadLetterOne), deadCountOpen: dl(sqlDeadLettersCountOpen), deadMarkRetried: dl(sqlDeadLetterMarkRetried),
		deadOpenAny: dl(sqlDeadLettersOpenAny), deadAllAny: dl(sqlDeadLettersAllAny), deadCountByConsumer: dl(sqlDeadLettersCountByConsumer),
		versionsLock: vs(sqlVersionsLock), versionsWrite: vs(sqlVersionsWrite),
		versionsDeleteBefore: vs(sqlVersionsDeleteBefore), versionsDeleteExpired: vs(sqlVersionsDeleteExpired),
	}}, nil
}

// RecordInbox inserts, through q (the transaction of the effect), consumer
// durable's inbox rows of events processed at now, as a Consumer does
// before its handler, and reports for each whether it is new: false for an
// event the inbox held already — its row counts the duplicate — and for a
// second copy of one event among events. It returns the database's error,
// wrapped.
func (s *Store) RecordInbox(ctx context.Context, q Querier, durable string, now time.Time, events []Event) ([]bool, error) {
	// One entry per event id, in id order; copies count as duplicates.
	type entry struct {
		ev   Event
		dups int32
	}
	at := make(map[string]int, len(events))
	var entries []entry
	first := make([]bool, len(events))
	for i, ev := range events {
		if k, ok := at[ev.ID]; ok {
			entries[k].dups++
			continue
		}
		at[ev.ID], first[i] = len(entries), true
		entries = append(entries, entry{ev: ev})
	}
	n := len(entries)
	ids, types := make([]string, n), make([]string, n)
	seqs, deliveries, dups := make([]int64, n), make([]int32, n), make([]int32, n)
	for i, e := range entries {
		ids[i], types[i], dups[i] = e.ev.ID, e.ev.Type, e.dups
		seqs[i], deliveries[i] = int64(e.ev.Delivery.StreamSeq), int32(max(e.ev.Delivery.Deliveries, 1))
	}
	rows, err := q.Query(ctx, s.sql.inboxRecord, durable, ids, types, seqs, deliveries, dups, now.UTC())
	if err != nil {
		return nil, fmt.Errorf("inbox record: %w", err)
	}
	inserted := make(map[string]bool, n)
	var id string
	var fresh bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &fresh}, func() error {
		inserted[id] = fresh
		return nil
	}); err != nil {
		return nil, fmt.Errorf("inbox record: %w", err)
	}
	out := make([]bool, len(events))
	for i, ev := range events {
		out[i] = first[i] && inserted[ev.ID]
	}
	return out, nil
}

// forget deletes, through q, durable's inbox rows of events.
func (s *Store) forget(ctx context.Context, q Querier, durable string, events []Event) error {
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	if _, err := q.Exec(ctx, s.sql.inboxForget, durable, ids); err != nil {
		return fmt.Errorf("inbox forget: %w", err)
	}
	return nil
}

// DeleteExpiredInbox deletes up to limit inbox rows, of every consumer,
// processed more than retention ago by the database's clock, oldest
// first, and returns how many. The retention must cover the stream's
// MaxAge: an event the stream can still redeliver must still be
// remembered. Safe to run from several processes at once. It returns the
// database's error, wrapped.
func (s *Store) DeleteExpiredInbox(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, s.sql.inboxDeleteExpired, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("consumer: inbox cleanup: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeleteExpiredVersions deletes up to limit rows of the version guard's
// table (Config.Versions), of every consumer, whose note was deleted —
// the event applied last was its note.deleted — more than retention ago
// by the database's clock, oldest first, and returns how many. Give it
// the inbox's retention: a deleted note has no later version, and an
// earlier one can reach the consumer again only while the stream holds
// it, within its MaxAge; past that only a re-driven dead letter or a
// manual republish can, and the handler must then treat the delete as
// final (a tombstone) as it would without the guard. Rows of live notes
// are kept: without its row a note takes whatever version comes first,
// so two of its events out of order could lose a field. Safe to run from
// several processes at once. It returns the database's error, wrapped.
func (s *Store) DeleteExpiredVersions(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, s.sql.versionsDeleteExpired, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("consumer: versions cleanup: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Inbox records which events a consumer has applied, in the consumer's own
// transaction. The package's table (Migrate) is the default; a service
// that already keeps an inbox of its own — with columns of its own, read
// by its own tools — implements Inbox over it (Config.Inbox).
type Inbox interface {
	// Record inserts the inbox rows of events within tx and reports, for
	// each, whether it is new: false for an event the inbox held already
	// (a duplicate, whose effect must not be applied again) and for a
	// second copy of one event among events. A concurrent transaction
	// recording the same event must make Record wait for its outcome —
	// a unique key does — and, so that two transactions recording the
	// same events cannot deadlock, rows are best inserted in event id
	// order.
	Record(ctx context.Context, tx pgx.Tx, events []Event) (fresh []bool, err error)
	// Forget deletes, within tx, the rows Record inserted earlier in tx
	// for events that failed on their own: they stay unapplied and are
	// handled again.
	Forget(ctx context.Context, tx pgx.Tx, events []Event) error
}

// tableInbox is the package's own inbox table.
type tableInbox struct{ c *Consumer }

var _ Inbox = tableInbox{}

func (t tableInbox) Record(ctx context.Context, tx pgx.Tx, events []Event) ([]bool, error) {
	return t.c.store.RecordInbox(ctx, tx, t.c.cfg.Durable, t.c.cfg.Now(), events)
}

func (t tableInbox) Forget(ctx context.Context, tx pgx.Tx, events []Event) error {
	return t.c.store.forget(ctx, tx, t.c.cfg.Durable, events)
}

// DeleteInboxBefore deletes up to limit of this consumer's inbox rows
// processed before cutoff, oldest first, and returns how many. The inbox
// must remember an event for as long as the stream can deliver it again:
// keep cutoff at least the stream's MaxAge in the past (168h by default).
// Safe to run from several processes at once. It returns the database's
// error, wrapped.
func (c *Consumer) DeleteInboxBefore(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	tag, err := c.pool.Exec(ctx, c.store.sql.inboxDeleteBefore, c.cfg.Durable, cutoff.UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("consumer: inbox cleanup: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeleteVersionsBefore deletes up to limit of this consumer's rows of the
// version guard's table whose note was deleted before cutoff (by the
// time its note.deleted was applied), oldest first, and returns how many:
// DeleteInboxBefore's analogue, given the same cutoff. Rows of live notes
// are kept (see Store.DeleteExpiredVersions). Safe to run from several
// processes at once. It returns the database's error, wrapped.
func (c *Consumer) DeleteVersionsBefore(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	tag, err := c.pool.Exec(ctx, c.store.sql.versionsDeleteBefore, c.cfg.Durable, cutoff.UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("consumer: versions cleanup: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeadLetter is a message the consumer gave up on.
type DeadLetter struct {
	// Event is the message as parsed: its Delivery is always set, the
	// CloudEvents attributes only when the message parsed (ID is "" for
	// one that is not an event; its Nats-Msg-Id is in Delivery.Header).
	Event Event
	// Payload is the message's data, as delivered.
	Payload []byte
	// Reason is why it is a dead letter: the last error, or the delivery
	// count past the limit.
	Reason string
	// Err is that reason as an error: a *TooManyDeliveriesError, an
	// *InvalidEventError, a Permanent error, the handler's last error.
	Err error
}

// DeadLetterWriter stores dead letters where a service's operators look
// for them (Config.DeadLetters). The message is acknowledged only after
// WriteDeadLetter returned nil; an error leaves it to be redelivered, and
// the dead letter to be written on a later delivery.
type DeadLetterWriter interface {
	WriteDeadLetter(ctx context.Context, dl DeadLetter) error
}

// tableDeadLetters is the package's own dead-letter table.
type tableDeadLetters struct{ c *Consumer }

func (t tableDeadLetters) WriteDeadLetter(ctx context.Context, dl DeadLetter) error {
	return t.c.store.WriteDeadLetter(ctx, t.c.cfg.Durable, dl, t.c.cfg.Now())
}

// WriteDeadLetter stores dl as a dead letter of consumer durable, created
// at: for a DeadLetterWriter that words or counts its dead letters its own
// way and keeps them in the package's table. It returns the database's
// error, wrapped.
func (s *Store) WriteDeadLetter(ctx context.Context, durable string, dl DeadLetter, at time.Time) error {
	ev := dl.Event
	headers, err := json.Marshal(map[string][]string(ev.Delivery.Header))
	if err != nil || ev.Delivery.Header == nil {
		headers = []byte("{}")
	}
	payload := dl.Payload
	if payload == nil {
		payload = []byte{} // a message with no data
	}
	_, err = s.db.Exec(ctx, s.sql.deadInsert, durable, ev.ID, ev.Type, ev.Delivery.Subject,
		int64(ev.Delivery.StreamSeq), ev.Delivery.Deliveries, cmp.Or(dl.Reason, "unknown"), headers, payload, at.UTC())
	if err != nil {
		return fmt.Errorf("insert dead letter: %w", err)
	}
	return nil
}

// StoredDeadLetter is one dead letter as the table keeps it.
type StoredDeadLetter struct {
	ID       int64  `json:"id"`
	Consumer string `json:"consumer"`
	// EventID is the CloudEvents id; for a message that was not an event,
	// what its writer put there ("" or its Nats-Msg-Id).
	EventID   string `json:"event_id"`
	EventType string `json:"event_type"`
	StreamSeq int64  `json:"stream_seq"`
	Subject   string `json:"subject"`
	// Reason is why the consumer gave up on it; "error" in JSON, the name
	// attachment-worker dead-letters list --json has always printed.
	Reason     string    `json:"error"`
	Deliveries int       `json:"deliveries"`
	CreatedAt  time.Time `json:"created_at"`
	// RetriedAt is when it was last re-driven; nil while it is open.
	RetriedAt *time.Time          `json:"retried_at"`
	Headers   map[string][]string `json:"headers"`
	Payload   []byte              `json:"-"`
}

func scanDeadLetter(row pgx.Row) (StoredDeadLetter, error) {
	var l StoredDeadLetter
	var headers []byte
	err := row.Scan(&l.ID, &l.Consumer, &l.EventID, &l.EventType, &l.StreamSeq, &l.Subject, &l.Reason, &l.Deliveries,
		&l.CreatedAt, &l.RetriedAt, &headers, &l.Payload)
	if err != nil {
		return l, err
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &l.Headers); err != nil {
			return l, fmt.Errorf("dead letter %d: headers: %w", l.ID, err)
		}
	}
	return l, nil
}

// DeadLetterQuery selects dead letters of one consumer, or of every one.
type DeadLetterQuery struct {
	// Consumer is the durable consumer's name. Required unless
	// AnyConsumer.
	Consumer string
	// AnyConsumer selects every consumer's dead letters, in one id order
	// (ids are the table's, unique across consumers); Consumer must then
	// be "". For the tools that show every consumer, the operator console.
	AnyConsumer bool
	// All includes the dead letters already re-driven.
	All bool
	// After skips the ids up to it: the cursor of a page.
	After int64
	// Limit is the most returned; 0: no limit.
	Limit int
}

// DeadLetters returns q.Consumer's dead letters, or with q.AnyConsumer
// every consumer's, oldest first. It returns an error for a query that
// names no consumer and not AnyConsumer, or both, and the database's
// error, wrapped.
func (s *Store) DeadLetters(ctx context.Context, q DeadLetterQuery) ([]StoredDeadLetter, error) {
	var limit *int
	if q.Limit > 0 {
		limit = &q.Limit
	}
	var rows pgx.Rows
	var err error
	switch {
	case q.AnyConsumer && q.Consumer != "":
		return nil, errors.New("consumer: list dead letters: a consumer named and AnyConsumer")
	case q.AnyConsumer:
		stmt := s.sql.deadOpenAny
		if q.All {
			stmt = s.sql.deadAllAny
		}
		rows, err = s.db.Query(ctx, stmt, q.After, limit)
	case q.Consumer == "":
		return nil, errors.New("consumer: list dead letters: no consumer named")
	default:
		stmt := s.sql.deadOpen
		if q.All {
			stmt = s.sql.deadAll
		}
		rows, err = s.db.Query(ctx, stmt, q.Consumer, q.After, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("consumer: list dead letters: %w", err)
	}
	defer rows.Close()
	var out []StoredDeadLetter
	for rows.Next() {
		l, err := scanDeadLetter(rows)
		if err != nil {
			return nil, fmt.Errorf("consumer: list dead letters: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("consumer: list dead letters: %w", err)
	}
	return out, nil
}

// DeadLetter returns dead letter id of consumer durable, or an error
// wrapping ErrDeadLetterNotFound when durable has none with that id (it
// may be another consumer's), or the database's, wrapped.
func (s *Store) DeadLetter(ctx context.Context, durable string, id int64) (StoredDeadLetter, error) {
	l, err := scanDeadLetter(s.db.QueryRow(ctx, s.sql.deadOne, durable, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("dead letter %d of consumer %s: %w", id, durable, ErrDeadLetterNotFound)
	}
	if err != nil {
		return l, fmt.Errorf("consumer: get dead letter %d: %w", id, err)
	}
	return l, nil
}

// OpenDeadLetters counts consumer durable's dead letters not yet
// re-driven. It returns the database's error, wrapped.
func (s *Store) OpenDeadLetters(ctx context.Context, durable string) (int64, error) {
	var n int64
	if err := s.db.QueryRow(ctx, s.sql.deadCountOpen, durable).Scan(&n); err != nil {
		return 0, fmt.Errorf("consumer: count dead letters: %w", err)
	}
	return n, nil
}

// ConsumerDeadLetters is one consumer's count of open dead letters.
type ConsumerDeadLetters struct {
	Consumer string `json:"consumer"`
	Open     int64  `json:"open"`
}

// OpenDeadLettersByConsumer counts the dead letters not yet re-driven of
// every consumer that has some, by consumer name. It returns the
// database's error, wrapped.
func (s *Store) OpenDeadLettersByConsumer(ctx context.Context) ([]ConsumerDeadLetters, error) {
	rows, err := s.db.Query(ctx, s.sql.deadCountByConsumer)
	if err != nil {
		return nil, fmt.Errorf("consumer: count dead letters by consumer: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ConsumerDeadLetters])
	if err != nil {
		return nil, fmt.Errorf("consumer: count dead letters by consumer: %w", err)
	}
	return out, nil
}

// RedriveMsgID is the Nats-Msg-Id of a re-driven dead letter: a new one, so
// that JetStream's duplicate window does not drop it, and the same for every
// re-drive of one dead letter, so that re-driving it twice publishes once.
// The consumer's inbox still deduplicates by the CloudEvents id.
func RedriveMsgID(l StoredDeadLetter) string {
	return l.EventID + ":redrive:" + strconv.FormatInt(l.ID, 10)
}

// Redrive publishes dead letter l, as DeadLetter read it, to its subject
// with its headers and a new Nats-Msg-Id (RedriveMsgID), waits for the
// stream's acknowledgement, and marks it retried at now. It returns the
// publish's or the mark's error, wrapped.
func (s *Store) Redrive(ctx context.Context, js jetstream.JetStream, l StoredDeadLetter, now time.Time) (*jetstream.PubAck, error) {
	msg := nats.NewMsg(l.Subject)
	msg.Data = l.Payload
	for k, vs := range l.Headers {
		for _, v := range vs {
			msg.Header.Add(k, v)
		}
	}
	msg.Header.Set(nats.MsgIdHdr, RedriveMsgID(l))
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("republish dead letter %d to %s: %w", l.ID, l.Subject, err)
	}
	if _, err := s.db.Exec(ctx, s.sql.deadMarkRetried, l.ID, now.UTC()); err != nil {
		return ack, fmt.Errorf("mark dead letter %d retried (it was republished): %w", l.ID, err)
	}
	return ack, nil
}

// deadLetters is the router's poison queue: publishing a message to it
// writes its dead letter (Config.DeadLetters, or the package's table), so
// that the message is acknowledged only after the row committed. The
// topic is ignored: the table is the queue.
type deadLetters struct{ c *Consumer }

var _ message.Publisher = deadLetters{}

// deadLetterTimeout bounds the write of one dead letter.
const deadLetterTimeout = 10 * time.Second

// Publish writes msgs' dead letters, each with the reason the poison
// middleware set. It returns the first write's error: that message must
// then not be acknowledged.
func (dl deadLetters) Publish(_ string, msgs ...*message.Message) error {
	c := dl.c
	for _, m := range msgs {
		d := deliveryOf(m.Context())
		reason := m.Metadata.Get(middleware.ReasonForPoisonedKey)
		// Not the message's context: a dead letter is written even when
		// the handler's deadline has passed.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.Context()), deadLetterTimeout)
		err := c.deadLetters.WriteDeadLetter(ctx, DeadLetter{Event: d.event, Payload: []byte(m.Payload), Reason: reason, Err: d.deadErr})
		cancel()
		if err != nil {
			return err
		}
		c.m.count(ResultDeadLettered)
		c.log.Warn("dead letter recorded", d.event.logAttrs("subject", d.event.Delivery.Subject,
			"stream_seq", d.event.Delivery.StreamSeq, "deliveries", d.event.Delivery.Deliveries, "reason", reason)...)
	}
	return nil
}

// Close implements message.Publisher; there is nothing to close.
func (deadLetters) Close() error { return nil }
