// Package deadletter records messages a consumer gave up on — an event it can
// never parse, or one whose processing failed as often as the consumer allows
// — in the dead_letters table, lists them, and re-drives one to its subject
// once an operator has fixed the cause.
//
// DeadLetters writes them: the attachment worker's consumer
// (consumer.DeadLetterWriter) writes each before it acknowledges the
// message, so a message is acknowledged only after its dead letter
// committed.
package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/internal/db"
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

// DeadLetters writes the dead letters of one consumer.
type DeadLetters struct {
	db       Execer
	consumer string
	now      func() time.Time
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

// Record is a dead letter to write.
type Record struct {
	// EventID is the CloudEvents id, or the Nats-Msg-Id of a message that
	// is not an event.
	EventID string
	// StreamSeq and Subject say where the message was in the stream.
	StreamSeq int64
	Subject   string
	// Payload is the message's data; Headers its NATS headers.
	Payload []byte
	Headers map[string][]string
	// Reason is why the consumer gave up on it.
	Reason string
	// Deliveries is how often it was delivered (NumDelivered).
	Deliveries int
}

// Write records r as a dead letter at the clock's now. It returns the
// database's error, translated; the message must then not be
// acknowledged.
func (d *DeadLetters) Write(ctx context.Context, r Record) error {
	headers := []byte("{}")
	if len(r.Headers) > 0 {
		if b, err := json.Marshal(r.Headers); err == nil {
			headers = b
		}
	}
	reason := r.Reason
	if reason == "" {
		reason = "unknown"
	}
	_, err := d.db.Exec(ctx, sqlDeadLetterInsert, d.consumer, r.EventID, r.StreamSeq, r.Subject, r.Payload,
		string(headers), reason, r.Deliveries, d.now().UTC())
	if err != nil {
		return fmt.Errorf("insert dead letter: %w", db.Translate(err))
	}
	return nil
}

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

// Redrive republishes dead letter id (Republish). It returns the letter,
// or ErrNotFound.
func Redrive(ctx context.Context, q Querier, js jetstream.JetStream, id int64, now time.Time) (Letter, *jetstream.PubAck, error) {
	l, err := Get(ctx, q, id)
	if err != nil {
		return l, nil, err
	}
	ack, err := Republish(ctx, q, js, l, now)
	return l, ack, err
}

// Republish publishes letter l, as Get read it, to its subject with its
// headers and a new Nats-Msg-Id (RedriveMsgID), waits for the stream's
// acknowledgement, and marks it retried. It returns the publish's or the
// mark's error, wrapped.
func Republish(ctx context.Context, q Querier, js jetstream.JetStream, l Letter, now time.Time) (*jetstream.PubAck, error) {
	id := l.ID
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
		return nil, fmt.Errorf("republish dead letter %d to %s: %w", id, l.Subject, err)
	}
	if _, err := q.Exec(ctx, sqlDeadLetterMarkRetried, id, now.UTC()); err != nil {
		return ack, fmt.Errorf("mark dead letter %d retried (it was republished): %w", id, db.Translate(err))
	}
	return ack, nil
}
