package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// pollTimeout bounds one read of a polled gauge: a NATS or a database
// that does not answer costs the poll a few seconds, never a scrape.
const pollTimeout = 5 * time.Second

// maxPollReasons bounds the reasons a failing poll logs until it succeeds
// again: errors whose text varies must not make a line per read.
const maxPollReasons = 8

// poll runs read at once and then every Config.PendingInterval, until ctx
// ends, each read bounded by pollTimeout (or the interval, when shorter).
// It runs beside the handling, so handlers that hang, a pool that no
// longer fetches or a router that stopped do not stop it. A read that
// fails leaves its gauge as it was — a scrape reads the gauge and never
// waits — and is logged once per reason with msg, at debug when quiet
// says so, until a read succeeds again: NATS away for an hour is one line,
// not 240, and two reasons that alternate (a missing table and a read
// that ran out of time) are two lines, not one per read. At most
// maxPollReasons reasons are logged per failure.
func (c *Consumer) poll(ctx context.Context, msg string, quiet func(error) bool, read func(context.Context) error) {
	t := time.NewTicker(c.cfg.PendingInterval)
	defer t.Stop()
	logged := map[string]bool{}
	for {
		rctx, cancel := context.WithTimeout(ctx, min(c.cfg.PendingInterval, pollTimeout))
		err := read(rctx)
		cancel()
		switch {
		case err == nil:
			clear(logged)
		case ctx.Err() != nil:
		case !logged[err.Error()] && len(logged) < maxPollReasons:
			level := c.log.Warn
			if quiet(err) {
				level = c.log.Debug
			}
			level(msg, "error", err)
			logged[err.Error()] = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pollPending keeps quill_consumer_pending_messages: a stalled consumer
// shows as a backlog.
func (c *Consumer) pollPending(ctx context.Context) {
	c.poll(ctx, "cannot read the consumer's backlog; quill_consumer_pending_messages keeps its last value",
		func(err error) bool {
			// Run provisions it, and says why it cannot.
			return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
		}, c.readPending)
}

// readPending sets quill_consumer_pending_messages to what JetStream holds
// for the durable consumer and it has not acknowledged: the messages not
// yet delivered (NumPending) and those delivered and not acknowledged
// (NumAckPending, redeliveries and Nak'ed ones waiting for their delay
// included). It returns NATS's error, leaving the gauge as it was.
func (c *Consumer) readPending(ctx context.Context) error {
	cons, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Durable)
	if err != nil {
		return err
	}
	info := cons.CachedInfo()
	c.m.setPending(float64(info.NumPending) + float64(info.NumAckPending))
	return nil
}

// pollDeadLetters keeps quill_consumer_dead_letters, counted in the
// package's table rather than kept in memory: a retry from the command
// line, or a dead letter another process of the consumer wrote, changes
// the table, not this process.
func (c *Consumer) pollDeadLetters(ctx context.Context) {
	c.poll(ctx, "cannot count the consumer's dead letters; quill_consumer_dead_letters keeps its last value",
		func(error) bool { return false }, c.readDeadLetters)
}

// readDeadLetters sets quill_consumer_dead_letters to the Durable's dead
// letters not yet re-driven. It returns the database's error, leaving the
// gauge as it was.
func (c *Consumer) readDeadLetters(ctx context.Context) error {
	n, err := c.store.OpenDeadLetters(ctx, c.cfg.Durable)
	if err != nil {
		return err
	}
	c.m.setDeadLetters(n)
	return nil
}

// DeadLetterCount returns the Durable's dead letters not yet re-driven as
// Run last counted them in the package's table
// (quill_consumer_dead_letters), without reading the database: for a
// gauge of the service's own. It is 0 before the first count, and always
// without a Config.Registerer (Run counts only with one). With a
// Config.DeadLetters that keeps dead letters elsewhere it counts only
// what the package's table holds under the Durable — 0 for a service that
// never wrote there; such a service counts its own.
func (c *Consumer) DeadLetterCount() int64 {
	if c.m == nil {
		return 0
	}
	return c.m.deadLetters.Load()
}
