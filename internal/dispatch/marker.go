package dispatch

import (
	"context"

	"github.com/google/uuid"
)

// maxMarks is the most successes one statement marks.
const maxMarks = 256

// mark is a 2xx to record: the delivery, its answer's status, its
// endpoint; done receives the statement's outcome.
type mark struct {
	id       int64
	status   int
	endpoint uuid.UUID
	done     chan error
}

// marker writes the successes of every send of the process, group-committed:
// each statement takes every mark queued while the previous one ran (up to
// maxMarks), so under load one commit marks many deliveries and writes each
// endpoint's health once, and alone a mark costs what it did before, one
// statement. A send waits for its mark's outcome, as it waited for its own
// statement: its slot (the endpoint's concurrency) and the graceful stop
// are unchanged.
type marker struct {
	st    store
	queue chan mark
}

func newMarker(st store) *marker { return &marker{st: st, queue: make(chan mark, maxMarks)} }

// delivered records a success and returns the statement's error; ctx
// bounds the wait (the statement runs under the marker's own context).
func (mk *marker) delivered(ctx context.Context, c claimed, status int) error {
	m := mark{id: c.id, status: status, endpoint: c.endpoint, done: make(chan error, 1)}
	select {
	case mk.queue <- m:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-m.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run writes the queued marks until stop is closed and the queue is
// empty; every mark queued gets an outcome.
func (mk *marker) run(stop <-chan struct{}) {
	batch := make([]mark, 0, maxMarks)
	for {
		select {
		case m := <-mk.queue:
			batch = append(batch[:0], m)
		case <-stop:
			select {
			case m := <-mk.queue:
				batch = append(batch[:0], m)
			default:
				return
			}
		}
	more:
		for len(batch) < maxMarks {
			select {
			case m := <-mk.queue:
				batch = append(batch, m)
			default:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
		err := mk.st.delivered(ctx, batch)
		cancel()
		for _, m := range batch {
			m.done <- err
		}
	}
}
