// Package deadletter records messages a consumer gave up on — an event it can
// never parse, or one whose processing failed as often as the consumer allows
// — in the dead_letters table, lists them, and re-drives one to its subject
// once an operator has fixed the cause.
//
// DeadLetters is a watermill message.Publisher: the attachment worker uses it
// as the poison queue of its router, so a message is acknowledged only after
// its dead letter committed.
package deadletter

import (
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

	"github.com/quillhq/quill/internal/db"
)

// Metadata keys a consumer sets on a watermill message so that its dead
// letter says where it came from.
const (
	// MetaSubject is the NATS subject the message was delivered on.
	MetaSubject = "nats_subject"
	// MetaStreamSeq is its stream sequence.
	MetaStreamSeq = "nats_stream_seq"
	// MetaDeliveries is how often it was delivered (NumDelivered).
	MetaDeliveries = "nats_num_delivered"
	// MetaTimestamp is when the stream stored it (RFC 3339).
	MetaTimestamp = "nats_timestamp"
	// MetaMsgID is its Nats-Msg-Id header.
	MetaMsgID = "nats_msg_id"
	// MetaHeaders is every NATS header as a JSON object of string arrays.
	MetaHeaders = "nats_headers"
	// MetaEventID is the CloudEvents id when the payload parsed far enough.
	MetaEventID = "event_id"
)

// ErrNotFound is returned for a dead letter id that does not exist.
var ErrNotFound = errors.New("no dead letter with this id")

// Execer runs a statement: a pool or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier runs queries.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

var _ message.Publisher = (*DeadLetters)(nil)

// DeadLetters writes the messages published to it as dead letters of one
// consumer. Topic is ignored: the table is the queue.
type DeadLetters struct {
	db       Execer
	consumer string
	now      func() time.Time
	// OnWritten, when set, runs after each committed dead letter (the
	// worker counts dead_lettered with it).
	OnWritten func()
}

// New returns a publisher writing consumer's dead letters through db.
func New(db Execer, consumer string, now func() time.Time) *DeadLetters {
	if now == nil {
		now = time.Now
	}
	return &DeadLetters{db: db, consumer: consumer, now: now}
}

const sqlDeadLetterInsert = `INSERT INTO dead_letters
	(consumer, event_id, stream_seq, subject, payload, headers, error, deliveries, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// Publish records msgs as dead letters, each with its error (watermill's
// poison metadata reason_poisoned) and the delivery metadata (Meta* keys).
// It returns an error when a row could not be written; the message must then
// not be acknowledged.
func (d *DeadLetters) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		md := m.Metadata
		seq, _ := strconv.ParseInt(md.Get(MetaStreamSeq), 10, 64)
		deliveries, _ := strconv.Atoi(md.Get(MetaDeliveries))
		headers := md.Get(MetaHeaders)
		if headers == "" {
			headers = "{}"
		}
		eventID := md.Get(MetaEventID)
		if eventID == "" {
			eventID = md.Get(MetaMsgID)
		}
		reason := md.Get(middleware.ReasonForPoisonedKey)
		if reason == "" {
			reason = "unknown"
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.Context()), 10*time.Second)
		_, err := d.db.Exec(ctx, sqlDeadLetterInsert, d.consumer, eventID, seq, md.Get(MetaSubject), []byte(m.Payload),
			headers, reason, deliveries, d.now().UTC())
		cancel()
		if err != nil {
			return fmt.Errorf("insert dead letter: %w", db.Translate(err))
		}
		if d.OnWritten != nil {
			d.OnWritten()
		}
	}
	return nil
}

// Close implements message.Publisher; there is nothing to close.
func (d *DeadLetters) Close() error { return nil }

// Letter is one stored dead letter.
type Letter struct {
	ID         int64               `json:"id"`
	Consumer   string              `json:"consumer"`
	EventID    string              `json:"event_id"`
	StreamSeq  int64               `json:"stream_seq"`
	Subject    string              `json:"subject"`
	Error      string              `json:"error"`
	Deliveries int                 `json:"deliveries"`
	CreatedAt  time.Time           `json:"created_at"`
	RetriedAt  *time.Time          `json:"retried_at"`
	Headers    map[string][]string `json:"headers"`
	Payload    []byte              `json:"-"`
}

const (
	sqlDeadLetterList = `SELECT id, consumer, event_id, stream_seq, subject, error, deliveries, created_at, retried_at, headers, payload
	FROM dead_letters WHERE ($1 = '' OR consumer = $1) AND ($2 OR retried_at IS NULL) ORDER BY id`
	sqlDeadLetterGet = `SELECT id, consumer, event_id, stream_seq, subject, error, deliveries, created_at, retried_at, headers, payload
	FROM dead_letters WHERE id = $1`
	sqlDeadLetterMarkRetried = `UPDATE dead_letters SET retried_at = $2 WHERE id = $1`
)

func scan(row pgx.Row) (Letter, error) {
	var l Letter
	var headers []byte
	err := row.Scan(&l.ID, &l.Consumer, &l.EventID, &l.StreamSeq, &l.Subject, &l.Error, &l.Deliveries, &l.CreatedAt, &l.RetriedAt, &headers, &l.Payload)
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

// List returns the dead letters of consumer ("" for every consumer), oldest
// first; those already re-driven only when all is set.
func List(ctx context.Context, q Querier, consumer string, all bool) ([]Letter, error) {
	rows, err := q.Query(ctx, sqlDeadLetterList, consumer, all)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", db.Translate(err))
	}
	defer rows.Close()
	var out []Letter
	for rows.Next() {
		l, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("list dead letters: %w", err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", db.Translate(err))
	}
	return out, nil
}

// Get returns one dead letter, or ErrNotFound.
func Get(ctx context.Context, q Querier, id int64) (Letter, error) {
	l, err := scan(q.QueryRow(ctx, sqlDeadLetterGet, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return l, fmt.Errorf("get dead letter %d: %w", id, db.Translate(err))
	}
	return l, nil
}

// RedriveMsgID is the Nats-Msg-Id of a re-driven dead letter: a new one, so
// that JetStream's duplicate window does not drop it, and the same for every
// re-drive of one dead letter, so that re-driving it twice publishes once.
// The consumer's inbox still deduplicates by the CloudEvents id.
func RedriveMsgID(l Letter) string {
	return l.EventID + ":redrive:" + strconv.FormatInt(l.ID, 10)
}

// Redrive republishes dead letter id's payload to its subject, with its
// headers and a new Nats-Msg-Id (RedriveMsgID), waits for the stream's
// acknowledgement, and marks it retried. It returns the letter, or
// ErrNotFound.
func Redrive(ctx context.Context, q Querier, js jetstream.JetStream, id int64, now time.Time) (Letter, *jetstream.PubAck, error) {
	l, err := Get(ctx, q, id)
	if err != nil {
		return l, nil, err
	}
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
		return l, nil, fmt.Errorf("republish dead letter %d to %s: %w", id, l.Subject, err)
	}
	if _, err := q.Exec(ctx, sqlDeadLetterMarkRetried, id, now.UTC()); err != nil {
		return l, ack, fmt.Errorf("mark dead letter %d retried (it was republished): %w", id, db.Translate(err))
	}
	return l, ack, nil
}
