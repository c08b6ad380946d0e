package consumer

import (
	"context"
	"errors"
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
	if h == nil {
		return nil, errors.New("consumer: no handler")
	}
	return NewStaged(pool, js, cfg, Stages{Apply: func(ctx context.Context, tx pgx.Tx, items []*Item) error {
		events := make([]Event, len(items))
		for i, it := range items {
			events[i] = it.Event
		}
		return h(ctx, tx, events)
	}})
}

// batcher forms the batches. It runs no goroutine of its own: the first
// delivery to find no batch open opens one and leads it — waits for the
// others to join and for a commit slot, runs Prepare and the transaction
// in its own router goroutine and tells the members the outcome — while
// later deliveries join it and wait. Several batches may commit at once
// (up to MaxConcurrentBatches), each on its own connection.
type batcher struct {
	c     *Consumer
	size  int           // the most deliveries in one batch
	slots chan struct{} // one token per batch committing; nil for no bound

	mu   sync.Mutex
	open *batch // the batch still taking members, nil for none
}

func newBatcher(c *Consumer) *batcher {
	b := &batcher{c: c, size: min(c.cfg.MaxBatch, c.cfg.Concurrency)}
	if n := c.cfg.MaxConcurrentBatches; n > 0 {
		b.slots = make(chan struct{}, n)
	}
	return b
}

// batch is one group commit.
type batch struct {
	members []*delivery
	weight  int64
	full    chan struct{} // closed when the batch stops taking members because it is full
	done    chan struct{} // closed when outcomes are set

	// outcomes are each member's, by index.
	outcomes []outcome
}

// outcome is what a member of a batch learns from its leader.
type outcome struct {
	// err is the member's own failure (Prepare's, Apply's, Committed's).
	err error
	// alone, with cause, sends the member to a transaction of its own:
	// its batch failed as a whole (cause), or Prepare put it off.
	alone bool
	cause error
}

// handle is one attempt at d: in a batch when it can be, else alone.
func (b *batcher) handle(ctx context.Context, d *delivery) error {
	if d.alone || d.event.Delivery.Deliveries > 1 || b.size == 1 {
		return b.c.transact(ctx, d)
	}
	bt, i, leader := b.join(d)
	if leader {
		b.lead(bt, d.pool.handlers)
		close(bt.done)
	} else {
		// Not ctx: the leader's transaction holds this event, and only
		// its outcome says whether it committed. The transaction is
		// bounded by BatchTimeout.
		<-bt.done
	}
	o := bt.outcomes[i]
	if o.err != nil || o.alone {
		// Its further attempts run alone: an event that failed once
		// does not make its neighbours pay for it again.
		d.alone = true
	}
	if !o.alone {
		return o.err
	}
	if err := ctx.Err(); err != nil && o.cause != nil {
		// Cut short (the shutdown gave up, the handler timeout): no
		// time to handle it alone; it is redelivered.
		return fmt.Errorf("group commit: %v; not handled alone: %w", o.cause, err)
	}
	return b.c.transact(ctx, d)
}

// join adds d to the open batch, opening one when there is none, and
// returns the batch, d's index in it and whether d leads it.
func (b *batcher) join(d *delivery) (*batch, int, bool) {
	var w int64
	if f := b.c.cfg.Weight; f != nil {
		w = max(0, f(d.event))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	leader := b.open == nil
	if leader {
		b.open = &batch{full: make(chan struct{}), done: make(chan struct{})}
	}
	bt := b.open
	i := len(bt.members)
	bt.members = append(bt.members, d)
	bt.weight += w
	if len(bt.members) == b.size || (b.c.cfg.MaxBatchWeight > 0 && bt.weight >= b.c.cfg.MaxBatchWeight) {
		b.open = nil
		close(bt.full)
	}
	return bt, i, leader
}

// gather waits until bt is full or MaxBatchWait passed, then for a commit
// slot — the batch still taking members meanwhile — and closes it to new
// members. It returns the slot's release.
func (b *batcher) gather(bt *batch, parent context.Context) (release func()) {
	t := time.NewTimer(b.c.cfg.MaxBatchWait)
	select {
	case <-bt.full:
	case <-t.C:
	}
	t.Stop()
	release = func() {}
	if b.slots != nil {
		select {
		case b.slots <- struct{}{}:
			release = func() { <-b.slots }
		case <-parent.Done():
			// The shutdown gave up: the transaction fails at once.
		}
	}
	b.mu.Lock()
	if b.open == bt {
		b.open = nil
	}
	b.mu.Unlock()
	return release
}

// lead gathers bt, runs Prepare, commits what is ready in one transaction,
// bounded by BatchTimeout and ended early when the shutdown gives up on
// the handlers (parent), and sets every member's outcome.
func (b *batcher) lead(bt *batch, parent context.Context) {
	c := b.c
	release := b.gather(bt, parent)
	defer release()
	ctx, cancel := context.WithTimeout(parent, c.cfg.BatchTimeout)
	defer cancel()
	n := len(bt.members)
	bt.outcomes = make([]outcome, n)
	items := make([]*Item, n)
	for i, d := range bt.members {
		items[i] = &Item{Event: d.event}
	}
	fail := func(idx []int, err error) {
		for _, i := range idx {
			bt.outcomes[i] = outcome{alone: true, cause: err}
		}
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	if c.st.Prepare != nil {
		if err := recovered(func() { c.st.Prepare(ctx, items) }); err != nil {
			c.m.batch(batchFellBack, n)
			c.log.Warn("group commit failed; handling its events one by one", "events", n, "error", err)
			fail(all, err)
			return
		}
	}
	var ready, doneIdx []int
	var txItems, doneItems []*Item
	for i, it := range items {
		switch {
		case it.Err != nil:
			bt.outcomes[i].err = fmt.Errorf("prepare: %w", it.Err)
		case it.Later:
			bt.outcomes[i].alone = true
		case it.Skip:
			doneIdx, doneItems = append(doneIdx, i), append(doneItems, it)
		default:
			ready, txItems = append(ready, i), append(txItems, it)
		}
	}
	if len(txItems) > 0 {
		var err error
		if perr := recovered(func() { err = c.apply(ctx, txItems) }); perr != nil {
			err = perr
		}
		if err != nil {
			c.m.batch(batchFellBack, len(txItems))
			c.log.Warn("group commit failed; handling its events one by one", "events", len(txItems), "error", err)
			fail(ready, err)
			txItems, ready = nil, nil
		} else {
			c.m.batch(batchCommitted, len(txItems))
		}
	}
	for k, it := range txItems {
		if it.Err != nil {
			bt.outcomes[ready[k]].err = itemErr(it.Err)
			continue
		}
		doneIdx, doneItems = append(doneIdx, ready[k]), append(doneItems, it)
	}
	if len(doneItems) > 0 {
		c.done(doneItems)
		for k, it := range doneItems {
			bt.outcomes[doneIdx[k]].err = it.Err
		}
	}
}

// recovered runs f and returns its panic as an error: the members waiting
// for a batch's outcome must get one.
func recovered(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	f()
	return nil
}
