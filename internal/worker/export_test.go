package worker

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/consumer"
)

// BatchStats returns how many batches w prepared, how many events they
// carried and the most one carried (not counting the events handled alone:
// redeliveries, retries, the fallback after a failed batch).
func (w *Worker) BatchStats() (batches, events, largest int64) {
	return w.batches.Load(), w.jobs.Load(), w.largest.Load()
}

// CommitPayloads runs the worker's stages for payloads (note.created
// events) directly — BatchSize events per transaction, on Committers
// connections at once: prepare, then a transaction with the inbox rows,
// apply and the commit — with no JetStream or consumer: the ceiling of the
// pipeline's database work. It returns the first error of a transaction
// or of an event.
func (w *Worker) CommitPayloads(payloads [][]byte) error {
	var items []*consumer.Item
	for _, b := range payloads {
		ev, err := consumer.ParseEvent(b, "")
		if err != nil {
			return err
		}
		ev.Delivery.Deliveries = 1
		items = append(items, &consumer.Item{Event: ev})
	}
	chunks := make(chan []*consumer.Item, len(items)/w.cfg.BatchSize+1)
	for i := 0; i < len(items); i += w.cfg.BatchSize {
		chunks <- items[i:min(i+w.cfg.BatchSize, len(items))]
	}
	close(chunks)
	errs := make(chan error, w.cfg.Committers)
	for range w.cfg.Committers {
		go func() {
			for c := range chunks {
				ctx, cancel := context.WithTimeout(context.Background(), w.cfg.AckWait)
				err := w.commitNow(ctx, c)
				cancel()
				if err != nil {
					errs <- err
					for range chunks {
					}
					return
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range w.cfg.Committers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// commitNow is what the consumer does with one batch, without its
// fallbacks.
func (w *Worker) commitNow(ctx context.Context, items []*consumer.Item) error {
	w.prepare(ctx, items)
	for _, it := range items {
		if it.Err != nil || it.Later {
			return fmt.Errorf("event %s: prepare: %v (later %v)", it.Event.ID, it.Err, it.Later)
		}
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		events := make([]consumer.Event, len(items))
		for i, it := range items {
			events[i] = it.Event
		}
		if _, err := (inboxTable{consumer: w.cfg.Consumer, now: w.now}).Record(ctx, tx, events); err != nil {
			return err
		}
		if err := w.apply(ctx, tx, items); err != nil {
			return err
		}
		for _, it := range items {
			if it.Err != nil {
				return fmt.Errorf("event %s: %w", it.Event.ID, it.Err)
			}
		}
		return nil
	})
}
