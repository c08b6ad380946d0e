package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// BatchHandler applies the effects of several events inside tx, the
// consumer's own transaction, which already holds their inbox rows (group
// commit). events are the fresh ones of the deliveries gathered — at least
// one, at most Config.MaxBatch, in the order they were received; a
// duplicate is acknowledged and left out. With Config.OrderBySubject no two
// events of one subject are in one call. As with Handler, it must write
// through tx only and return when ctx is done.
//
// Returning nil commits tx and then acknowledges every message. An error
// — or a panic, a failed commit, Config.BatchTimeout passing — rolls the
// whole batch back, and each of its events is handled again alone: the
// handler called with that one event in a transaction of its own, whose
// error follows Handler's rules (in-process retries, redelivery with
// backoff, a dead letter at MaxDeliver or at once when Permanent). So one
// bad event costs its neighbours a second transaction, not a failure.
type BatchHandler func(ctx context.Context, tx pgx.Tx, events []Event) error

// NewBatch returns a Consumer like New's whose handler commits the events
// delivered together in one transaction: up to Config.MaxBatch events
// (and no more than Config.Concurrency, the deliveries the process holds)
// that arrive within Config.MaxBatchWait of the first. A redelivered
// message (its delivery count above 1) is handled alone, in a transaction
// of its own, so that an event that failed once does not make a batch
// fail again. Every other rule of New holds: Validate and unparseable
// messages are dead letters before any transaction, MaxDeliver, Permanent,
// metrics (with quill_consumer_batch_size besides), shutdown. It returns
// New's errors.
func NewBatch(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, h BatchHandler) (*Consumer, error) {
	var one Handler
	if h != nil {
		one = func(ctx context.Context, tx pgx.Tx, ev Event) error { return h(ctx, tx, []Event{ev}) }
	}
	c, err := newConsumer(pool, js, cfg, one, true)
	if err != nil {
		return nil, err
	}
	c.batch = &batcher{c: c, h: h, size: min(c.cfg.MaxBatch, c.cfg.Concurrency)}
	return c, nil
}

// batcher forms the batches. It runs no goroutine of its own: the first
// delivery to find no batch open opens one and leads it — waits for the
// others to join, runs the transaction in its own router goroutine and
// tells the members the outcome — while later deliveries join it and
// wait. Several batches may commit at once, each on its own connection.
type batcher struct {
	c    *Consumer
	h    BatchHandler
	size int // the most deliveries in one batch

	mu   sync.Mutex
	open *batch // the batch still taking members, nil for none
}

// batch is one group commit.
type batch struct {
	members []*delivery
	full    chan struct{} // closed when the batch stops taking members because it is full
	done    chan struct{} // closed when failed and errs are set

	// failed is the transaction's error: no member's effect committed,
	// and each is handled again alone.
	failed error
	// errs are, once the batch committed, each member's own outcome:
	// nil, or the test hook's simulated crash before the ack.
	errs []error
}

// handle is one attempt at d: in a batch when it can be, else alone.
func (b *batcher) handle(ctx context.Context, d *delivery) error {
	if d.alone || d.event.Delivery.Deliveries > 1 || b.size == 1 {
		return b.c.transact(ctx, d)
	}
	bt, i, leader := b.join(d)
	if leader {
		b.gather(bt)
		b.commit(bt, d.pool.handlers)
		close(bt.done)
	} else {
		// Not ctx: the leader's transaction holds this event, and only
		// its outcome says whether it committed. The transaction is
		// bounded by BatchTimeout.
		<-bt.done
	}
	if bt.failed == nil {
		return bt.errs[i]
	}
	d.alone = true
	if err := ctx.Err(); err != nil {
		// Cut short (the shutdown gave up, the handler timeout): no
		// time to handle it alone; it is redelivered.
		return fmt.Errorf("group commit: %v; not handled alone: %w", bt.failed, err)
	}
	return b.c.transact(ctx, d)
}

// join adds d to the open batch, opening one when there is none, and
// returns the batch, d's index in it and whether d leads it.
func (b *batcher) join(d *delivery) (*batch, int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	leader := b.open == nil
	if leader {
		b.open = &batch{full: make(chan struct{}), done: make(chan struct{})}
	}
	bt := b.open
	i := len(bt.members)
	bt.members = append(bt.members, d)
	if len(bt.members) == b.size {
		b.open = nil
		close(bt.full)
	}
	return bt, i, leader
}

// gather waits until bt is full or MaxBatchWait passed, then closes it to
// new members.
func (b *batcher) gather(bt *batch) {
	t := time.NewTimer(b.c.cfg.MaxBatchWait)
	select {
	case <-bt.full:
	case <-t.C:
	}
	t.Stop()
	b.mu.Lock()
	if b.open == bt {
		b.open = nil
	}
	b.mu.Unlock()
}

// commit runs bt's transaction, bounded by BatchTimeout and ended early
// when the shutdown gives up on the handlers (parent), and sets its
// outcome.
func (b *batcher) commit(bt *batch, parent context.Context) {
	c := b.c
	ctx, cancel := context.WithTimeout(parent, c.cfg.BatchTimeout)
	defer cancel()
	fresh, err := b.transact(ctx, bt.members)
	if err != nil {
		bt.failed = err
		c.m.batch(batchFellBack, len(bt.members))
		c.log.Warn("group commit failed; handling its events one by one", "events", len(bt.members), "error", err)
		return
	}
	c.m.batch(batchCommitted, len(bt.members))
	bt.errs = make([]error, len(bt.members))
	for i, d := range bt.members {
		if !fresh[i] {
			c.m.count(ResultDuplicate)
			c.log.Debug("duplicate event", "event_id", d.event.ID, "deliveries", d.event.Delivery.Deliveries)
			continue
		}
		c.m.count(ResultProcessed)
		if c.afterCommit != nil {
			bt.errs[i] = c.afterCommit(d.event)
		}
	}
}

// transact is the batch's transaction: the inbox rows of every member,
// the handler with the fresh events, the commit. It reports which members
// were fresh. A panic of the handler is its error: the members waiting
// for the outcome must get one.
func (b *batcher) transact(ctx context.Context, members []*delivery) (fresh []bool, err error) {
	c := b.c
	defer func() {
		if r := recover(); r != nil {
			fresh, err = nil, fmt.Errorf("handler panicked: %v", r)
		}
	}()
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return nil, fmt.Errorf("begin transaction: %w", err)
	}
	defer func() {
		// As in Consumer.transact: a rollback that survives ctx.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = tx.Rollback(rctx)
		cancel()
	}()
	fresh, err = c.inboxInsertBatch(ctx, tx, members)
	if err != nil {
		return nil, err
	}
	events := make([]Event, 0, len(members))
	for i, d := range members {
		if fresh[i] {
			events = append(events, d.event)
		}
	}
	if len(events) > 0 {
		if err := b.h(ctx, tx, events); err != nil {
			return nil, fmt.Errorf("handler: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Perhaps committed after all: the events handled alone then
		// find their inbox rows and are duplicates.
		return nil, fmt.Errorf("commit: %w", err)
	}
	return fresh, nil
}

// sqlInboxInsertBatch inserts the inbox rows of a batch in one statement,
// in event id order so that two batches holding the same events (two
// processes, a republish) wait for each other rather than deadlock, and
// returns the ids inserted. An id twice in the batch is inserted once.
const sqlInboxInsertBatch = `INSERT INTO %s (consumer, event_id, event_type, stream_seq, deliveries, processed_at)
	SELECT $1, e.id, e.type, e.seq, e.deliveries, $6
	FROM unnest($2::uuid[], $3::text[], $4::bigint[], $5::integer[]) AS e(id, type, seq, deliveries)
	ORDER BY e.id
	ON CONFLICT (consumer, event_id) DO NOTHING
	RETURNING event_id::text`

// inboxInsertBatch records members' events in the inbox within tx and
// reports, for each, whether it is new: false for an event the inbox held
// already and for a second copy of one event within the batch.
func (c *Consumer) inboxInsertBatch(ctx context.Context, tx pgx.Tx, members []*delivery) ([]bool, error) {
	n := len(members)
	ids, types := make([]string, n), make([]string, n)
	seqs, deliveries := make([]int64, n), make([]int32, n)
	for i, d := range members {
		ids[i], types[i] = d.event.ID, d.event.Type
		seqs[i], deliveries[i] = int64(d.event.Delivery.StreamSeq), int32(d.event.Delivery.Deliveries)
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(sqlInboxInsertBatch, c.t.inbox), c.cfg.Durable, ids, types, seqs, deliveries, c.cfg.Now().UTC())
	if err != nil {
		return nil, fmt.Errorf("inbox insert: %w", err)
	}
	inserted := make(map[string]bool, n)
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		inserted[id] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("inbox insert: %w", err)
	}
	fresh := make([]bool, n)
	for i, id := range ids {
		fresh[i] = inserted[id]
		delete(inserted, id) // a second copy of id is a duplicate
	}
	return fresh, nil
}
