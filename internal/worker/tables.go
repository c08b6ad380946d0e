package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/deadletter"
	"github.com/quillhq/quill/internal/inbox"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/tracing"
)

// inboxTable is the consumer's Inbox over the worker's own inbox table
// (internal/inbox), whose delivery and duplicate counts the audits read.
type inboxTable struct {
	consumer string
	now      func() time.Time
}

var _ consumer.Inbox = inboxTable{}

// Record records events in tx, in event id order (so that two batches
// holding the same events wait for each other rather than deadlock). A
// second copy of one event is not fresh and is counted in its row's
// duplicates.
func (t inboxTable) Record(ctx context.Context, tx pgx.Tx, events []consumer.Event) ([]bool, error) {
	at := make(map[string]int, len(events))
	var entries []inbox.Entry
	first := make([]bool, len(events))
	for i, ev := range events {
		if k, ok := at[ev.ID]; ok {
			entries[k].Duplicates++
			continue
		}
		id, err := uuid.Parse(ev.ID)
		if err != nil {
			return nil, fmt.Errorf("inbox record: event id %q: %w", ev.ID, err)
		}
		at[ev.ID], first[i] = len(entries), true
		entries = append(entries, inbox.Entry{EventID: id, Deliveries: ev.Delivery.Deliveries})
	}
	order := slices.Clone(entries)
	slices.SortFunc(order, func(a, b inbox.Entry) int { return strings.Compare(a.EventID.String(), b.EventID.String()) })
	b := &pgx.Batch{}
	inbox.QueueRecord(b, t.consumer, t.now().UTC().Truncate(time.Microsecond), order)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("inbox record: %w", db.Translate(err))
	}
	freshByID := make(map[uuid.UUID]bool, len(order))
	for _, e := range order {
		freshByID[e.EventID] = e.Fresh
	}
	fresh := make([]bool, len(events))
	for i, ev := range events {
		fresh[i] = first[i] && freshByID[entries[at[ev.ID]].EventID]
	}
	return fresh, nil
}

// Forget deletes, in tx, the rows of events recorded earlier in tx.
func (t inboxTable) Forget(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
	ids := make([]uuid.UUID, 0, len(events))
	for _, ev := range events {
		if id, err := uuid.Parse(ev.ID); err == nil {
			ids = append(ids, id)
		}
	}
	b := &pgx.Batch{}
	inbox.QueueForget(b, t.consumer, ids)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("inbox forget: %w", db.Translate(err))
	}
	return nil
}

// deadLetterTable is the consumer's DeadLetterWriter over the worker's
// dead_letters table, which attachment-worker dead-letters lists and
// re-drives; it counts dead_lettered.
type deadLetterTable struct {
	dl  *deadletter.DeadLetters
	m   *metrics.Worker
	log zerolog.Logger
}

var _ consumer.DeadLetterWriter = deadLetterTable{}

func (t deadLetterTable) WriteDeadLetter(ctx context.Context, l consumer.DeadLetter) error {
	d := l.Event.Delivery
	id := l.Event.ID
	if id == "" {
		// Not an event: the publisher's message id names it.
		id = d.Header.Get(nats.MsgIdHdr)
	}
	reason := l.Reason
	var past *consumer.TooManyDeliveriesError
	if errors.As(l.Err, &past) {
		// The operators' wording (docs/worker.md).
		reason = fmt.Sprintf("delivered %d times, the limit is %d (not processed again)", past.Deliveries, past.Limit)
	}
	if err := t.dl.Write(ctx, deadletter.Record{EventID: id, StreamSeq: int64(d.StreamSeq), Subject: d.Subject,
		Payload: l.Payload, Headers: d.Header, Reason: reason, Deliveries: d.Deliveries}); err != nil {
		return err
	}
	t.m.Message(metrics.WorkerDeadLettered)
	t.log.Warn().Ctx(tracing.Extract(ctx, d.Header.Get("traceparent"), d.Header.Get("tracestate"))).
		Str("event_id", id).Int("deliveries", d.Deliveries).Str("error_category", "dead_letter").
		Str("reason", reason).Msg("giving up on the message: dead letter recorded")
	return nil
}
