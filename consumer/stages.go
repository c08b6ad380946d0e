package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// Item is one delivery of a batch as the functions of Stages see it, from
// Prepare to Committed. They are called with the items of one batch, or
// with one item alone; they may set the fields documented as theirs.
type Item struct {
	// Event is the delivered event.
	Event Event
	// Alone is true when the item is handled in a transaction of its
	// own: a redelivery, an in-process retry, the fallback after a failed
	// batch, an item Prepare put off (Later), or a consumer without
	// batches.
	Alone bool

	// Prepared is Prepare's: what it computed for the event, for Apply.
	Prepared any
	// Later is Prepare's: the event's preparation is still running (a
	// slow computation). The item leaves its batch, which commits without
	// it, and is handled alone at once: Prepare is called again for it
	// alone, and should then wait for the preparation already under way
	// rather than start another. An item alone that Prepare leaves Later
	// fails, and is retried.
	Later bool
	// Skip is Prepare's: the event needs no effect. It is acknowledged
	// without a transaction and without an inbox row, and counted under
	// Result (default ResultSkipped).
	Skip bool

	// Err, set by Prepare or Apply (or, before Apply, by the version
	// guard: a *HeldBackError, or an *InvalidEventError for a malformed
	// version), fails this event on its own: its
	// inbox row is forgotten in the same transaction — Apply must leave
	// its effect unwritten — while the rest commits, and it is then
	// handled under Handler's error rules (retried alone in process,
	// Nak'ed with backoff, a dead letter at MaxDeliver, or at once when
	// Permanent).
	// Set by Committed, it stands for a crash between the commit and the
	// acknowledgement: the message is not acknowledged.
	Err error
	// Result is the result the event is counted under once committed
	// (quill_consumer_messages_total). Apply may set it — "failed" for an
	// effect that records a failure, say. Default ResultProcessed; the
	// consumer sets ResultDuplicate for an event the inbox held and
	// ResultStale for one the version guard skipped (Stale), and Apply
	// sees neither.
	Result string
	// Duplicate is set, before Apply, on an event the inbox already held
	// or that appeared twice in the batch.
	Duplicate bool
	// Stale is set, before Apply, under Config.Versions, on a note event
	// whose version is not above the note's version the consumer applied
	// (Event.Version): Apply does not see it; it commits with its inbox
	// row and is counted ResultStale.
	Stale bool
}

// Stages are the steps of a consumer made by NewStaged, for a handler
// that does part of its work outside the transaction (reads, CPU-bound
// computations, calls that hold no lock) and wants per-event outcomes
// within a group commit.
type Stages struct {
	// Prepare, optional, runs before the transaction and outside it, for
	// every delivery of a batch (a duplicate included: the inbox is read
	// in the transaction) or for one alone. A batch's Prepare has the
	// batch's context, bounded by Config.BatchTimeout: it may put off
	// the items it cannot finish in time (Item.Later). It sets, per
	// item, Prepared, Err, Later or Skip. A panic fails the whole batch,
	// whose events are then handled alone.
	Prepare func(ctx context.Context, items []*Item)
	// Apply applies the effects of the fresh items inside tx, the
	// consumer's transaction, which already holds their inbox rows — and,
	// under Config.Versions, the locked versions rows of their notes, the
	// stale and held-back items left out and each note's events in
	// version order. It must write through tx only. Per item it may set Err (that event
	// fails alone; the rest commits) and Result. Returning an error — or
	// panicking, or outlasting Config.BatchTimeout — rolls the whole
	// batch back, and each event is handled again alone, as with
	// BatchHandler. Required.
	Apply func(ctx context.Context, tx pgx.Tx, items []*Item) error
	// Committed, optional, runs after the commit and before the
	// acknowledgements, with the items that committed (duplicates
	// included) and those Prepare skipped: to count, notify, observe. An
	// Err it sets keeps that message from being acknowledged.
	Committed func(items []*Item)
}

// ResultSkipped is the default result of an item Prepare skipped.
const ResultSkipped = "skipped"

// NewStaged returns a Consumer whose deliveries go through st: Prepare
// outside any transaction, Apply inside it with per-event outcomes,
// Committed after the commit. Deliveries are gathered into group commits
// as NewBatch's are (Config.MaxBatch, MaxBatchWait, MaxConcurrentBatches,
// Weight and MaxBatchWeight); a redelivered message is handled alone.
// Every rule of New holds. It returns New's errors, and one when st.Apply
// is nil.
func NewStaged(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, st Stages) (*Consumer, error) {
	if st.Apply == nil {
		return nil, errors.New("consumer: no Stages.Apply")
	}
	c, err := newConsumer(pool, js, cfg, st, true)
	if err != nil {
		return nil, err
	}
	c.batch = newBatcher(c)
	return c, nil
}

// transact handles d alone: Prepare, its transaction, Committed.
func (c *Consumer) transact(ctx context.Context, d *delivery) error {
	it := &Item{Event: d.event, Alone: true}
	items := []*Item{it}
	if c.st.Prepare != nil {
		c.st.Prepare(ctx, items)
		switch {
		case it.Err != nil:
			return fmt.Errorf("prepare: %w", it.Err)
		case it.Later:
			return errors.New("prepare: put off an event handled alone")
		case it.Skip:
			c.done(items)
			return it.Err
		}
	}
	if err := c.apply(ctx, items); err != nil {
		return err
	}
	if it.Err != nil {
		return itemErr(it.Err)
	}
	c.done(items)
	return it.Err
}

// itemErr is the error of an item that failed on its own: Apply's, as the
// handler's; the version guard's as it is.
func itemErr(err error) error {
	var inv *InvalidEventError
	if isHeldBack(err) || errors.As(err, &inv) {
		return err
	}
	return fmt.Errorf("handler: %w", err)
}

// apply is one transaction: the inbox rows of items, Apply with the fresh
// ones, the forgetting of those Apply failed, the commit. Its error means
// nothing committed.
func (c *Consumer) apply(ctx context.Context, items []*Item) error {
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer func() {
		// After a commit this does nothing; otherwise it must run even
		// when ctx was cancelled, or the connection goes back to the
		// pool in a transaction.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = tx.Rollback(rctx)
		cancel()
	}()
	events := make([]Event, len(items))
	for i, it := range items {
		events[i] = it.Event
	}
	fresh, err := c.inbox.Record(ctx, tx, events)
	if err != nil {
		return err
	}
	var todo []*Item
	for i, it := range items {
		if fresh[i] {
			todo = append(todo, it)
			continue
		}
		// The effect committed with an earlier delivery (a redelivery
		// after a lost ack, a republish beyond the duplicate window).
		it.Duplicate, it.Result = true, ResultDuplicate
	}
	if len(todo) > 0 {
		run := todo
		var g *guardTx
		if c.cfg.Versions != VersionsOff {
			if g, run, err = c.guard(ctx, tx, todo); err != nil {
				return err
			}
		}
		if len(run) > 0 {
			if err := c.st.Apply(ctx, tx, run); err != nil {
				return fmt.Errorf("handler: %w", err)
			}
		}
		if g != nil {
			if err := g.finish(ctx, tx); err != nil {
				return err
			}
		}
		var failed []Event
		for _, it := range todo {
			if it.Err != nil {
				failed = append(failed, it.Event)
			}
		}
		if len(failed) > 0 {
			if err := c.inbox.Forget(ctx, tx, failed); err != nil {
				return err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Perhaps committed after all: the events handled again find
		// their inbox rows and are duplicates.
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// done counts the items that committed or were skipped, then runs
// Committed and the tests' hook.
func (c *Consumer) done(items []*Item) {
	for _, it := range items {
		switch {
		case it.Result != "":
		case it.Skip:
			it.Result = ResultSkipped
		default:
			it.Result = ResultProcessed
		}
		c.m.count(it.Result)
		if it.Duplicate {
			c.log.Debug("duplicate event", it.Event.logAttrs("deliveries", it.Event.Delivery.Deliveries)...)
		}
	}
	if c.st.Committed != nil {
		c.st.Committed(items)
	}
	if c.afterCommit != nil {
		for _, it := range items {
			if it.Err == nil && !it.Skip {
				it.Err = c.afterCommit(it.Event)
			}
		}
	}
}
