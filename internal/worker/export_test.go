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
// events) directly — MaxBatch events per transaction, on MaxConcurrentBatches
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
	cc := w.cfg.Consumer
	chunks := make(chan []*consumer.Item, len(items)/cc.MaxBatch+1)
	for i := 0; i < len(items); i += cc.MaxBatch {
		chunks <- items[i:min(i+cc.MaxBatch, len(items))]
	}
	close(chunks)
	errs := make(chan error, cc.MaxConcurrentBatches)
	for range cc.MaxConcurrentBatches {
		go func() {
			for c := range chunks {
				ctx, cancel := context.WithTimeout(context.Background(), cc.AckWait)
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
	for range cc.MaxConcurrentBatches {
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
		if _, err := w.store.RecordInbox(ctx, tx, w.cfg.Consumer.Durable, w.now(), events); err != nil {
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
