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

// inboxInsert records ev in the inbox within tx and reports whether it is
// new (false: a duplicate).
func (c *Consumer) inboxInsert(ctx context.Context, tx pgx.Tx, ev Event) (bool, error) {
	tag, err := tx.Exec(ctx, fmt.Sprintf(sqlInboxInsert, c.t.inbox), c.cfg.Durable, ev.ID, ev.Type,
		int64(ev.Delivery.StreamSeq), ev.Delivery.Deliveries, c.cfg.Now().UTC())
	if err != nil {
		return false, fmt.Errorf("inbox insert: %w", err)
	}
	return tag.RowsAffected() == 1, nil
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

// deadLetters is the router's poison queue: publishing a message to it
// writes its dead letter, so that the message is acknowledged only after
// the row committed. The topic is ignored: the table is the queue.
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
		headers, err := json.Marshal(map[string][]string(d.event.Delivery.Header))
		if err != nil || d.event.Delivery.Header == nil {
			headers = []byte("{}")
		}
		// Not the message's context: a dead letter is written even when
		// the handler's deadline has passed.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.Context()), deadLetterTimeout)
		_, err = c.pool.Exec(ctx, fmt.Sprintf(sqlDeadLetterInsert, c.t.deadLetters), c.cfg.Durable, d.event.ID, d.event.Type,
			d.event.Delivery.Subject, int64(d.event.Delivery.StreamSeq), d.event.Delivery.Deliveries, reason, headers,
			[]byte(m.Payload), c.cfg.Now().UTC())
		cancel()
		if err != nil {
			return fmt.Errorf("insert dead letter: %w", err)
		}
		c.m.count(ResultDeadLettered)
		c.log.Warn("dead letter recorded", "event_id", d.event.ID, "subject", d.event.Delivery.Subject,
			"stream_seq", d.event.Delivery.StreamSeq, "deliveries", d.event.Delivery.Deliveries, "reason", reason)
	}
	return nil
}

// Close implements message.Publisher; there is nothing to close.
func (deadLetters) Close() error { return nil }
