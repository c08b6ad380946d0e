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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/semaphore"

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
// BatchWait for more) and handles them in three steps:
//
//  1. Read, without locks, each event's note and attachment: its state,
//     and its bytes when it is pending.
//  2. Process the pending attachments outside any transaction: each is
//     admitted by its decode weight (attachment.DecodeMemory) under the
//     decode budget (QUILL_WORKER_DECODE_MEMORY), and by a CPU slot
//     (GOMAXPROCS at once). The lane waits for them until half of the
//     batch's deadline (AckWait); an attachment still processing then is
//     left out of the batch and committed alone once it finished, so one
//     slow image delays only its own event.
//  3. One transaction of two round trips: BEGIN; lock the notes and
//     attachments of every event (in note id order, so concurrent batches
//     never deadlock on them); record every event id in the inbox, which
//     tells fresh events from duplicates; then, re-checking each
//     attachment's state under the lock, store the results, write the
//     attachment.processed events and COMMIT.
//
// No note is locked while its attachment is processed: an API update or
// delete of the note waits only for the writes of step 3. Since an
// attachment's state only moves forward (pending → processed or failed,
// a note only to deleted), the state read in step 1 can only have moved on
// by step 3, which then records the event as a duplicate or skipped.
//
// Every handler gets its own event's outcome, and only after the COMMIT
// returned, so each message is still acknowledged only after its effect
// committed. An event that fails on its own — its note is missing, its
// processing returned an error or panicked — is left out of the writes, its
// inbox row forgotten in the same transaction, and only its handler gets the
// error; the others commit. Any other failure of the transaction, the end
// of the batch's deadline included, makes the lane retry each event alone
// in its own transaction (with the results already computed), so an event
// that breaks a statement fails alone — except when the database is
// unreachable: then every event of the batch gets that error and is retried
// by the handler's retry middleware and JetStream's redelivery.

// job is one delivery submitted by a handler.
type job struct {
	p          parsed
	deliveries int
	trace      string
	done       chan outcome // buffered; receives exactly one outcome
	// proc is the processing of the job's attachment, once started; it
	// is kept for the job's retry alone.
	proc *processing
	// state is the note's attachment as read before processing.
	state attState
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
	// mem admits attachments by their decode weight under budget bytes.
	mem    *semaphore.Weighted
	budget int64
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
		stop: make(chan struct{}), cpu: make(chan struct{}, runtime.GOMAXPROCS(0)),
		mem: semaphore.NewWeighted(w.cfg.DecodeMemory), budget: w.cfg.DecodeMemory}
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
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(c.w.cfg.AckWait))
	defer cancel()
	if err := c.prepare(ctx, batch); err != nil {
		for _, j := range batch {
			j.done <- outcome{err: err}
		}
		return
	}
	ready, late := c.await(batch, start.Add(c.w.cfg.AckWait/2))
	for _, j := range late {
		// Its processing outlasted half of the batch's deadline: it
		// commits alone once done, and delays no other event.
		c.wg.Go(func() {
			<-j.proc.done
			j.done <- c.alone(j)
		})
	}
	if len(ready) == 0 {
		return
	}
	outs, err := c.safeTransact(ctx, ready)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		// The batch's own deadline ended (a slow statement, a lock
		// waited for): not the database being unavailable.
		c.w.log.Warn().Err(err).Int("batch", len(ready)).Str("error_category", "batch_deadline").
			Msg("group commit outlasted its deadline: committing its events one by one")
		outs = c.oneByOne(ready)
	case len(ready) == 1, errors.Is(err, db.ErrUnavailable):
		outs = make([]outcome, len(ready))
		for i := range outs {
			outs[i] = outcome{err: err}
		}
	default:
		c.w.log.Warn().Err(err).Int("batch", len(ready)).Str("error_category", "batch_failed").
			Msg("group commit failed: committing its events one by one")
		outs = c.oneByOne(ready)
	}
	for i, j := range ready {
		j.done <- outs[i]
	}
}

// oneByOne commits each job of batch in its own transaction.
func (c *committer) oneByOne(batch []*job) []outcome {
	outs := make([]outcome, len(batch))
	for i, j := range batch {
		outs[i] = c.alone(j)
	}
	return outs
}

// alone commits j in its own transaction, with a deadline of its own.
func (c *committer) alone(j *job) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), c.w.cfg.AckWait)
	defer cancel()
	o, err := c.safeTransact(ctx, []*job{j})
	if err != nil {
		return outcome{err: err}
	}
	return o[0]
}

// safeTransact is transact with a panic turned into an error, so that no
// handler waits for ever.
func (c *committer) safeTransact(ctx context.Context, batch []*job) (outs []outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			outs, err = nil, fmt.Errorf("group commit: panic: %v", r)
		}
	}()
	return c.transact(ctx, batch)
}

// attState is a note's attachment as read or locked.
type attState struct {
	found   bool
	deleted bool
	attID   uuid.UUID
	status  string
}

// processable reports whether the attachment of j's event is to be
// processed in state s.
func (s attState) processable(j *job) bool {
	return s.found && !s.deleted && s.attID == j.p.att.id && s.status == notes.AttachmentPending
}

// sqlAttachmentsRead reads, without locks, the state of the notes'
// attachments and the bytes of those still to process.
const sqlAttachmentsRead = `SELECT n.id, n.deleted_at IS NOT NULL, a.id, a.status,
	CASE WHEN n.deleted_at IS NULL AND a.status = 'pending' THEN a.data END
	FROM notes n
	JOIN unnest($1::uuid[], $2::text[]) AS k(note_id, tenant) ON n.id = k.note_id AND n.tenant = k.tenant
	JOIN attachments a ON a.note_id = n.id`

// sqlAttachmentsLock locks the notes and their attachments, in note id
// order, reading their state again (not their bytes: the processing is
// done). The notes' row locks order each event this transaction writes
// after every event of the same note committed before it, and a
// concurrent delete after it.
const sqlAttachmentsLock = `SELECT n.id, n.deleted_at IS NOT NULL, a.id, a.status
	FROM notes n
	JOIN unnest($1::uuid[], $2::text[]) AS k(note_id, tenant) ON n.id = k.note_id AND n.tenant = k.tenant
	JOIN attachments a ON a.note_id = n.id
	ORDER BY n.id
	FOR UPDATE OF n, a`

// noteArgs are the note ids and tenants of jobs, as query arguments.
func noteArgs(jobs []*job) ([]pgtype.UUID, []string) {
	ids := make([]pgtype.UUID, len(jobs))
	tenants := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i], tenants[i] = pgtype.UUID{Bytes: j.p.noteID, Valid: true}, j.p.tenant
	}
	return ids, tenants
}

// prepare reads the attachments of the jobs not prepared yet and starts
// processing those pending, one processing per attachment. It returns an
// error when the read failed (nothing was started).
func (c *committer) prepare(ctx context.Context, batch []*job) error {
	var todo []*job
	for _, j := range batch {
		if j.proc == nil {
			todo = append(todo, j)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	ids, tenants := noteArgs(todo)
	type read struct {
		s    attState
		data []byte
	}
	found := make(map[uuid.UUID]read, len(todo))
	rows, err := c.pool.Query(ctx, sqlAttachmentsRead, ids, tenants)
	if err != nil {
		return fmt.Errorf("read attachments: %w", db.Translate(err))
	}
	var noteID uuid.UUID
	var r read
	_, err = pgx.ForEachRow(rows, []any{&noteID, &r.s.deleted, &r.s.attID, &r.s.status, &r.data}, func() error {
		r.s.found = true
		found[noteID] = r
		r = read{}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read attachments: %w", db.Translate(err))
	}
	started := map[uuid.UUID]*processing{}
	for _, j := range todo {
		r := found[j.p.noteID]
		j.state = r.s
		if !r.s.processable(j) {
			continue
		}
		if p, ok := started[r.s.attID]; ok {
			j.proc = p
			continue
		}
		p := &processing{attID: r.s.attID, done: make(chan struct{})}
		started[r.s.attID], j.proc = p, p
		c.wg.Go(func() { c.process(p, j, r.data) })
	}
	return nil
}

// process runs p for job j's attachment data under the decode budget and a
// CPU slot.
func (c *committer) process(p *processing, j *job, data []byte) {
	defer close(p.done)
	// An image heavier than the whole budget is refused by
	// attachment.Process without decoding: it waits for nothing.
	weight := min(attachment.DecodeMemory(data), c.budget)
	if weight > 0 {
		// Never fails: the context never ends.
		_ = c.mem.Acquire(context.Background(), weight)
		defer c.mem.Release(weight)
	}
	c.cpu <- struct{}{}
	defer func() { <-c.cpu }()
	if h := c.w.hooks.Processing; h != nil {
		h(j.p.id.String())
	}
	lim := c.w.cfg.Limits
	lim.DecodeMemory = c.budget
	p.run(j, data, lim)
	if weight >= heavyDecode {
		// The decoded image became garbage with its thumbnail encoded.
		// Collected now, before its weight is released, its pages are
		// what the next admitted decode reuses; left to the GC's pace
		// (GOGC, GOMEMLIMIT), the next decode would allocate beside it
		// and the resident memory overshoot the budget by a decode.
		// Cheap: pixel buffers hold no pointers, so marking is the
		// worker's small pointer heap.
		runtime.GC()
	}
}

// heavyDecode is the decode weight from which an image's memory is
// collected as soon as it was processed.
const heavyDecode = 32 << 20

// await waits until every job's processing finished or deadline passed;
// ready are the jobs to commit now, late those still processing.
func (c *committer) await(batch []*job, deadline time.Time) (ready, late []*job) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	expired := false
	for _, j := range batch {
		if j.proc == nil {
			ready = append(ready, j)
			continue
		}
		if !expired {
			select {
			case <-j.proc.done:
			case <-timer.C:
				expired = true
			}
		}
		select {
		case <-j.proc.done:
			ready = append(ready, j)
		default:
			late = append(late, j)
		}
	}
	return ready, late
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
	attState
	fresh bool
	out   outcome
}

// processing is the processing of one attachment, outside any
// transaction; its fields are set when done is closed.
type processing struct {
	attID  uuid.UUID
	done   chan struct{}
	ev     ProcessedData
	result []byte
	thumb  []byte
	// out is the outcome: its result, or an error of the processing.
	out outcome
}

// transact runs batch in one transaction under ctx. It returns one outcome
// per job — an error outcome for a job that failed on its own — or an error
// when the transaction as a whole failed (nothing committed).
func (c *committer) transact(ctx context.Context, batch []*job) ([]outcome, error) {
	w := c.w
	now := w.now().UTC().Truncate(time.Microsecond)

	es := make([]entry, len(batch))
	var recs []inbox.Entry
	recOf := make(map[uuid.UUID]int, len(batch)) // event id → index in recs
	leaderOf := make(map[uuid.UUID]int, len(batch))
	var locked []*job
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
		locked = append(locked, j)
	}

	tx, err := db.BeginPipeline(ctx, c.pool)
	if err != nil {
		return nil, err
	}
	defer tx.Release()

	// Round trip 1: begin, lock, record.
	rows := make(map[uuid.UUID]attState, len(locked))
	b := tx.Batch()
	ids, tenants := noteArgs(locked)
	b.Queue(sqlAttachmentsLock, ids, tenants).Query(func(r pgx.Rows) error {
		var noteID uuid.UUID
		var s attState
		_, err := pgx.ForEachRow(r, []any{&noteID, &s.deleted, &s.attID, &s.status}, func() error {
			s.found = true
			rows[noteID] = s
			s = attState{}
			return nil
		})
		return err
	})
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
		e.attState = rows[e.j.p.noteID]
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
		case e.j.proc == nil || e.j.proc.attID != e.attID:
			// Unreachable while states only move forward: the read
			// before processing saw the attachment no longer pending.
			e.out.err = fmt.Errorf("attachment %s is pending again after it was read as %s", e.attID, e.j.state.status)
			forget = append(forget, e.j.p.id)
		default:
			if _, ok := processedBy[e.attID]; ok {
				e.leader, e.sameAtt = processedBy[e.attID], true
				e.out.result = metrics.WorkerDuplicate
				continue
			}
			processedBy[e.attID] = i
			e.out = e.j.proc.out
			work = append(work, i)
		}
	}

	// Round trip 2: the writes and the commit.
	b = tx.Batch()
	var results []notes.AttachmentResult
	for _, i := range work {
		e := &es[i]
		if e.out.err != nil {
			forget = append(forget, e.j.p.id)
			continue
		}
		p := e.j.proc
		results = append(results, notes.AttachmentResult{ID: e.attID, Status: p.ev.State, Result: p.result,
			Reason: p.ev.Reason, Thumbnail: p.thumb})
		// Derived from the note.created event's id (decision 0050): processing
		// it again, after a restore or beyond the inbox's memory, writes the
		// event every consumer has seen already.
		if err := outbox.Queue(b, outbox.Event{ID: notes.ProcessedEventID(e.j.p.id), Tenant: e.j.p.tenant, AggregateID: e.j.p.noteID,
			Type: outbox.TypeAttachmentProcessed, Time: now, Data: p.ev, Traceparent: e.j.trace}); err != nil {
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

// run processes j's attachment data, recovering a panic as the
// processing's own error.
func (p *processing) run(j *job, data []byte, lim attachment.Limits) {
	defer func() {
		if r := recover(); r != nil {
			p.out = outcome{err: fmt.Errorf("process attachment: panic: %v", r)}
		}
	}()
	a := j.p.att
	res, err := attachment.Process(attachment.Input{ContentType: a.contentType, Filename: a.filename,
		Size: a.size, SHA256: a.sha256, Data: data}, lim)
	p.ev = ProcessedData{NoteID: j.p.noteID.String(), AttachmentID: p.attID.String()}
	var permanent *attachment.PermanentError
	switch {
	case errors.As(err, &permanent):
		p.ev.State, p.ev.Reason = StateFailed, permanent.Reason
		p.out.result = metrics.WorkerFailed
	case err != nil:
		p.out.err = fmt.Errorf("process attachment: %w", err)
	default:
		p.ev.State, p.ev.DetectedType = StateProcessed, res.DetectedType
		if p.result, err = res.JSON(); err != nil {
			p.out.err = err
			return
		}
		if res.Thumbnail != nil {
			p.thumb = res.Thumbnail.PNG
		}
		p.out.result = metrics.WorkerProcessed
	}
}

// commitNow prepares batch, waits for all of its processing and commits it
// in one transaction: the benchmark's direct path (CommitPayloads).
func (c *committer) commitNow(ctx context.Context, batch []*job) ([]outcome, error) {
	if err := c.prepare(ctx, batch); err != nil {
		return nil, err
	}
	for _, j := range batch {
		if j.proc != nil {
			<-j.proc.done
		}
	}
	return c.transact(ctx, batch)
}
