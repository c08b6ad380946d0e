package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// pendingTimeout bounds one read of the durable consumer's info: a NATS
// that does not answer costs the poll a few seconds, never a scrape.
const pendingTimeout = 5 * time.Second

// pollPending reads the durable consumer's backlog from JetStream into
// quill_consumer_pending_messages at once and then every
// Config.PendingInterval, until ctx ends. It runs beside the handling, so
// handlers that hang, a pool that no longer fetches or a router that
// stopped do not stop it: a stalled consumer shows as a backlog. A read
// that fails keeps the last value — a scrape reads the gauge and never
// waits for NATS.
func (c *Consumer) pollPending(ctx context.Context) {
	t := time.NewTicker(c.cfg.PendingInterval)
	defer t.Stop()
	var lastErr string
	for {
		if err := c.readPending(ctx); err != nil && ctx.Err() == nil {
			// Once per reason: NATS away for an hour is one line, not 240.
			if err.Error() != lastErr {
				level := c.log.Warn
				if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
					level = c.log.Debug // Run provisions it, and says why it cannot
				}
				level("cannot read the consumer's backlog; quill_consumer_pending_messages keeps its last value", "error", err)
			}
			lastErr = err.Error()
		} else if err == nil {
			lastErr = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readPending sets quill_consumer_pending_messages to what JetStream holds
// for the durable consumer and it has not acknowledged: the messages not
// yet delivered (NumPending) and those delivered and not acknowledged
// (NumAckPending, redeliveries and Nak'ed ones waiting for their delay
// included). It returns NATS's error, leaving the gauge as it was.
func (c *Consumer) readPending(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(c.cfg.PendingInterval, pendingTimeout))
	defer cancel()
	cons, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Durable)
	if err != nil {
		return err
	}
	info := cons.CachedInfo()
	c.m.setPending(float64(info.NumPending) + float64(info.NumAckPending))
	return nil
}
