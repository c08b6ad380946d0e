package worker

import "context"

// BatchStats returns how many group-commit transactions w ran, how many
// events they carried and the most one carried (not counting the retries
// one by one after a failed batch).
func (w *Worker) BatchStats() (batches, events, largest int64) {
	return w.commit.batches.Load(), w.commit.jobs.Load(), w.commit.largest.Load()
}

// CommitPayloads runs the worker's group-commit transactions for payloads
// (note.created events) directly — BatchSize events per transaction, on
// Committers connections at once — with no JetStream, router or handlers:
// the ceiling of the pipeline's database work. It returns the first error
// of a transaction or of an event.
func (w *Worker) CommitPayloads(payloads [][]byte) error {
	var jobs []*job
	for _, b := range payloads {
		p, err := parse(b)
		if err != nil {
			return err
		}
		jobs = append(jobs, &job{p: p, deliveries: 1, done: make(chan outcome, 1)})
	}
	chunks := make(chan []*job, len(jobs)/w.cfg.BatchSize+1)
	for i := 0; i < len(jobs); i += w.cfg.BatchSize {
		chunks <- jobs[i:min(i+w.cfg.BatchSize, len(jobs))]
	}
	close(chunks)
	errs := make(chan error, w.cfg.Committers)
	for range w.cfg.Committers {
		go func() {
			for c := range chunks {
				ctx, cancel := context.WithTimeout(context.Background(), w.cfg.AckWait)
				outs, err := w.commit.commitNow(ctx, c)
				cancel()
				if err == nil {
					for _, o := range outs {
						if o.err != nil {
							err = o.err
						}
					}
				}
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
