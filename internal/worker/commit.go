package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/inbox"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
)

// Group commit. The router's handlers (Concurrency of them) each submit
// their event to a committer and wait. Each of the committer's Committers
// lanes takes every submitted event waiting when it becomes free (up to
// BatchSize events and BatchBytes attachment bytes, after waiting up to
// BatchWait for more) and handles them in one transaction of two round
// trips:
//
//  1. BEGIN; lock the notes and attachments of every event (in note id
//     order, so concurrent batches never deadlock on them); record every
//     event id in the inbox, which tells fresh events from duplicates.
//  2. Process the fresh events' attachments, in parallel up to GOMAXPROCS;
//     then store the results, write the attachment.processed events and
//     COMMIT.
//
// Every handler gets its own event's outcome, and only after the COMMIT
// returned, so each message is still acknowledged only after its effect
// committed. An event that fails on its own — its note is missing, its
// processing returned an error or panicked — is left out of the writes, its
// inbox row forgotten in the same transaction, and only its handler gets the
// error; the others commit. Any other failure of the transaction makes the
// lane retry each event alone in its own transaction, so an event that
// breaks a statement fails alone — except when the database is unreachable:
// then every event of the batch gets that error and is retried by the
// handler's retry middleware and JetStream's redelivery.

// job is one delivery submitted by a handler.
type job struct {
	p          parsed
	deliveries int
	trace      string
	done       chan outcome // buffered; receives exactly one outcome
}

// outcome is what a handler learns about its job.
type outcome struct {
	// result is the metrics result (processed, failed, duplicate,
	// skipped) when err is nil.
	result    string
	err       error
	committed time.Time
}

// committer runs the group-commit lanes.
type committer struct {
	w     *Worker
	pool  *pgxpool.Pool
	queue chan *job
	stop  chan struct{}
	wg    sync.WaitGroup
	// cpu bounds the attachments processed at once across lanes.
	cpu chan struct{}
	// gathering is held by the lane forming a batch.
	gathering sync.Mutex
	// batches and jobs count the transactions run and the jobs they
	// carried (retries one by one included).
	batches, jobs atomic.Int64
	// largest is the most jobs one transaction carried.
	largest atomic.Int64
}

var errStopping = errors.New("worker stopping: the event was not processed")

func newCommitter(w *Worker) *committer {
	return &committer{w: w, pool: w.pool, queue: make(chan *job, w.cfg.BatchSize*w.cfg.Committers),
		stop: make(chan struct{}), cpu: make(chan struct{}, runtime.GOMAXPROCS(0))}
}

// start runs the lanes until close.
func (c *committer) start() {
	for range c.w.cfg.Committers {
		c.wg.Go(c.lane)
	}
}

// close stops the lanes once the jobs already submitted are handled; no
// job may be submitted after it was called.
func (c *committer) close() {
	close(c.stop)
	c.wg.Wait()
}

// submit hands j to a lane and waits for its outcome.
func (c *committer) submit(j *job) outcome {
	select {
	case c.queue <- j:
	case <-c.stop:
		return outcome{err: errStopping}
	}
	return <-j.done
}

// lane gathers a batch and commits it, until close. One lane gathers at a
// time (gathering), so a batch forms while the other lanes commit theirs
// rather than the lanes splitting the waiting events among them.
func (c *committer) lane() {
	batch := make([]*job, 0, c.w.cfg.BatchSize)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		c.gathering.Lock()
		batch = c.gather(batch[:0], timer)
		c.gathering.Unlock()
		if len(batch) == 0 {
			return
		}
		c.run(batch)
	}
}

// gather appends to batch the next job, waiting for it, then those
// submitted within BatchWait, up to BatchSize jobs and BatchBytes. It
// returns an empty batch once the committer is closed and nothing is
// queued.
func (c *committer) gather(batch []*job, timer *time.Timer) []*job {
	var first *job
	select {
	case first = <-c.queue:
	case <-c.stop:
		// Handlers stop submitting before close; finish what is queued.
		select {
		case first = <-c.queue:
		default:
			return batch
		}
	}
	batch = append(batch, first)
	bytes := first.size()
	var window <-chan time.Time
	if c.w.cfg.BatchWait > 0 {
		timer.Reset(c.w.cfg.BatchWait)
		defer timer.Stop()
		window = timer.C
	}
	for len(batch) < c.w.cfg.BatchSize && bytes < c.w.cfg.BatchBytes {
		var j *job
		select {
		case j = <-c.queue:
		default:
			if window == nil {
				return batch
			}
			select {
			case j = <-c.queue:
			case <-window:
				return batch
			}
		}
		batch = append(batch, j)
		bytes += j.size()
	}
	return batch
}

func (j *job) size() int {
	if j.p.att == nil {
		return 0
	}
	return j.p.att.size
}

// run commits batch and delivers every job's outcome.
func (c *committer) run(batch []*job) {
	c.batches.Add(1)
	c.jobs.Add(int64(len(batch)))
	for n := int64(len(batch)); ; {
		l := c.largest.Load()
		if n <= l || c.largest.CompareAndSwap(l, n) {
			break
		}
	}
	outs, err := c.safeTransact(batch)
	switch {
	case err == nil:
	case len(batch) == 1, errors.Is(err, db.ErrUnavailable):
		outs = make([]outcome, len(batch))
		for i := range outs {
			outs[i] = outcome{err: err}
		}
	default:
		c.w.log.Warn().Err(err).Int("batch", len(batch)).Str("error_category", "batch_failed").
			Msg("group commit failed: committing its events one by one")
		outs = make([]outcome, len(batch))
		for i, j := range batch {
			o, err := c.safeTransact([]*job{j})
			if err != nil {
				o = []outcome{{err: err}}
			}
			outs[i] = o[0]
		}
	}
	for i, j := range batch {
		j.done <- outs[i]
	}
}

// safeTransact is transact with a panic turned into an error, so that no
// handler waits for ever.
func (c *committer) safeTransact(batch []*job) (outs []outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			outs, err = nil, fmt.Errorf("group commit: panic: %v", r)
		}
	}()
	return c.transact(batch)
}

// entry is a job's state inside one transaction.
type entry struct {
	j *job
	// leader is the index of the entry this one follows, or -1: an
	// earlier delivery of the same event (no inbox row of its own), or
	// when sameAtt an earlier event of the same attachment.
	leader  int
	sameAtt bool
	// From the lock.
	found   bool
	deleted bool
	attID   uuid.UUID
	status  string
	data    []byte
	// After processing.
	fresh  bool
	ev     ProcessedData
	result []byte
	thumb  []byte
	out    outcome
}

// transact runs batch in one transaction. It returns one outcome per job
// — an error outcome for a job that failed on its own — or an error when
// the transaction as a whole failed (nothing committed).
func (c *committer) transact(batch []*job) ([]outcome, error) {
	w := c.w
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.AckWait)
	defer cancel()
	now := w.now().UTC().Truncate(time.Microsecond)

	es := make([]entry, len(batch))
	var recs []inbox.Entry
	recOf := make(map[uuid.UUID]int, len(batch)) // event id → index in recs
	leaderOf := make(map[uuid.UUID]int, len(batch))
	notesOf := make([]notes.NoteRef, 0, len(batch))
	for i, j := range batch {
		es[i] = entry{j: j, leader: -1}
		if l, ok := leaderOf[j.p.id]; ok {
			// The same event twice in one batch: one inbox row, and
			// this delivery is its duplicate.
			es[i].leader = l
			recs[recOf[j.p.id]].Duplicates++
			continue
		}
		leaderOf[j.p.id] = i
		recOf[j.p.id] = len(recs)
		recs = append(recs, inbox.Entry{EventID: j.p.id, Deliveries: j.deliveries})
		notesOf = append(notesOf, notes.NoteRef{Tenant: j.p.tenant, ID: j.p.noteID})
	}

	tx, err := db.BeginPipeline(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	defer tx.Release()

	// Round trip 1: begin, lock, record. The notes' row locks order each
	// event this transaction writes after every event of the same note
	// committed before it, and a concurrent delete after it.
	rows := make(map[uuid.UUID]notes.LockedAttachment, len(notesOf))
	b := tx.Batch()
	notes.QueueAttachmentsLock(b, notesOf, rows)
	inbox.QueueRecord(b, w.cfg.Consumer, now, recs)
	if err := tx.Send(ctx); err != nil {
		return nil, fmt.Errorf("lock and record: %w", err)
	}

	var forget []uuid.UUID
	// processedBy maps an attachment to the entry processing it in this
	// batch: a second event for it is a duplicate, as one for an
	// attachment no longer pending.
	processedBy := map[uuid.UUID]int{}
	var work []int
	for i := range es {
		e := &es[i]
		if e.leader >= 0 {
			continue
		}
		e.fresh = recs[recOf[e.j.p.id]].Fresh
		l, ok := rows[e.j.p.noteID]
		e.found, e.deleted, e.attID, e.status, e.data = ok, l.NoteDeleted, l.ID, l.Status, l.Data
		switch {
		case !e.fresh:
			e.out.result = metrics.WorkerDuplicate
		case !e.found:
			// Notes are never removed (only marked deleted), so the
			// event belongs to another database: nothing here can ever
			// process it.
			e.out.err = &permanentError{fmt.Sprintf("note %s of tenant %s has no attachment in this database", e.j.p.noteID, e.j.p.tenant)}
			forget = append(forget, e.j.p.id)
		case e.deleted:
			e.out.result = metrics.WorkerSkipped
		case e.attID != e.j.p.att.id:
			// A note has one attachment, fixed at its creation: an event
			// naming another was not written by this database's API.
			e.out.err = &permanentError{fmt.Sprintf("event names attachment %s, but note %s's attachment is %s",
				e.j.p.att.id, e.j.p.noteID, e.attID)}
			forget = append(forget, e.j.p.id)
		case e.status != notes.AttachmentPending:
			// Processed under another event id, or before the inbox
			// forgot this one: the effect exists, do not repeat it.
			e.out.result = metrics.WorkerDuplicate
		default:
			if _, ok := processedBy[e.attID]; ok {
				e.leader, e.sameAtt = processedBy[e.attID], true
				e.out.result = metrics.WorkerDuplicate
				continue
			}
			processedBy[e.attID] = i
			work = append(work, i)
		}
	}

	// Processing: pure computation on the locked data.
	var wg sync.WaitGroup
	for _, i := range work {
		c.cpu <- struct{}{}
		wg.Go(func() {
			defer func() { <-c.cpu }()
			es[i].process(w.cfg.Limits)
		})
	}
	wg.Wait()

	// Round trip 2: the writes and the commit.
	b = tx.Batch()
	var results []notes.AttachmentResult
	for _, i := range work {
		e := &es[i]
		if e.out.err != nil {
			forget = append(forget, e.j.p.id)
			continue
		}
		results = append(results, notes.AttachmentResult{ID: e.attID, Status: e.ev.State, Result: e.result,
			Reason: e.ev.Reason, Thumbnail: e.thumb})
		eid, err := uuid.NewV7()
		if err != nil {
			tx.Rollback(ctx)
			return nil, fmt.Errorf("new event id: %w", err)
		}
		if err := outbox.Queue(b, outbox.Event{ID: eid, Tenant: e.j.p.tenant, AggregateID: e.j.p.noteID,
			Type: outbox.TypeAttachmentProcessed, Time: now, Data: e.ev, Traceparent: e.j.trace}); err != nil {
			tx.Rollback(ctx)
			return nil, fmt.Errorf("outbox event: %w", err)
		}
	}
	for i := range es {
		if e := &es[i]; e.sameAtt && es[e.leader].out.err != nil {
			forget = append(forget, e.j.p.id)
		}
	}
	notes.QueueAttachmentsProcessed(b, now, results)
	for i := range es {
		if e := &es[i]; e.leader < 0 && e.out.err == nil && e.out.result == metrics.WorkerSkipped {
			notes.QueueAttachmentSkipped(b, e.attID, ReasonNoteDeleted)
		}
	}
	if len(forget) > 0 {
		inbox.QueueForget(b, w.cfg.Consumer, forget)
	}
	// A lost COMMIT reply needs no recheck here: the message is not
	// acknowledged, and its redelivery finds the inbox row if it committed.
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("store results: %w", err)
	}
	committed := w.now()

	outs := make([]outcome, len(es))
	for i := range es {
		e := &es[i]
		o := e.out
		if e.leader >= 0 {
			// A follower shares its leader's fate: a duplicate once the
			// leader's effect committed, its error otherwise.
			o = outcome{result: metrics.WorkerDuplicate}
			if err := es[e.leader].out.err; err != nil {
				o = outcome{err: err}
			}
		}
		o.committed = committed
		outs[i] = o
	}
	return outs, nil
}

// process runs the attachment processing of e, recovering a panic as e's
// own error.
func (e *entry) process(lim attachment.Limits) {
	defer func() {
		if r := recover(); r != nil {
			e.out = outcome{err: fmt.Errorf("process attachment: panic: %v", r)}
		}
	}()
	a := e.j.p.att
	res, err := attachment.Process(attachment.Input{ContentType: a.contentType, Filename: a.filename,
		Size: a.size, SHA256: a.sha256, Data: e.data}, lim)
	e.data = nil
	e.ev = ProcessedData{NoteID: e.j.p.noteID.String(), AttachmentID: e.attID.String()}
	var permanent *attachment.PermanentError
	switch {
	case errors.As(err, &permanent):
		e.ev.State, e.ev.Reason = StateFailed, permanent.Reason
		e.out.result = metrics.WorkerFailed
	case err != nil:
		e.out.err = fmt.Errorf("process attachment: %w", err)
	default:
		e.ev.State, e.ev.DetectedType = StateProcessed, res.DetectedType
		if e.result, err = res.JSON(); err != nil {
			e.out.err = err
			return
		}
		if res.Thumbnail != nil {
			e.thumb = res.Thumbnail.PNG
		}
		e.out.result = metrics.WorkerProcessed
	}
}
