package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
)

// The table names are validated identifiers (tablesOf), never input.
const (
	// ON CONFLICT DO NOTHING: a concurrent transaction inserting the same
	// event makes this one wait for it, and then see its row.
	sqlInboxInsert = `INSERT INTO %s (consumer, event_id, event_type, stream_seq, deliveries, processed_at)
	VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer, event_id) DO NOTHING`

	sqlInboxDeleteExpired = `DELETE FROM %[1]s WHERE (consumer, event_id) IN (
		SELECT consumer, event_id FROM %[1]s WHERE consumer = $1 AND processed_at < $2
		ORDER BY processed_at LIMIT $3 FOR UPDATE SKIP LOCKED)`

	sqlDeadLetterInsert = `INSERT INTO %s
	(consumer, event_id, event_type, subject, stream_seq, deliveries, reason, headers, payload, created_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`
)

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
	c := t.c
	if len(events) == 1 {
		ev := events[0]
		tag, err := tx.Exec(ctx, fmt.Sprintf(sqlInboxInsert, c.t.inbox), c.cfg.Durable, ev.ID, ev.Type,
			int64(ev.Delivery.StreamSeq), ev.Delivery.Deliveries, c.cfg.Now().UTC())
		if err != nil {
			return nil, fmt.Errorf("inbox insert: %w", err)
		}
		return []bool{tag.RowsAffected() == 1}, nil
	}
	return c.inboxInsertBatch(ctx, tx, events)
}

const sqlInboxForget = `DELETE FROM %s WHERE consumer = $1 AND event_id = ANY($2::uuid[])`

func (t tableInbox) Forget(ctx context.Context, tx pgx.Tx, events []Event) error {
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(sqlInboxForget, t.c.t.inbox), t.c.cfg.Durable, ids); err != nil {
		return fmt.Errorf("inbox forget: %w", err)
	}
	return nil
}

// DeleteInboxBefore deletes up to limit of this consumer's inbox rows
// processed before cutoff, oldest first, and returns how many. The inbox
// must remember an event for as long as the stream can deliver it again:
// keep cutoff at least the stream's MaxAge in the past (168h by default).
// Safe to run from several processes at once. It returns the database's
// error, wrapped.
func (c *Consumer) DeleteInboxBefore(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	tag, err := c.pool.Exec(ctx, fmt.Sprintf(sqlInboxDeleteExpired, c.t.inbox), c.cfg.Durable, cutoff.UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("consumer: inbox cleanup: %w", err)
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
	c := t.c
	ev := dl.Event
	headers, err := json.Marshal(map[string][]string(ev.Delivery.Header))
	if err != nil || ev.Delivery.Header == nil {
		headers = []byte("{}")
	}
	_, err = c.pool.Exec(ctx, fmt.Sprintf(sqlDeadLetterInsert, c.t.deadLetters), c.cfg.Durable, ev.ID, ev.Type,
		ev.Delivery.Subject, int64(ev.Delivery.StreamSeq), ev.Delivery.Deliveries, dl.Reason, headers,
		dl.Payload, c.cfg.Now().UTC())
	if err != nil {
		return fmt.Errorf("insert dead letter: %w", err)
	}
	return nil
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
