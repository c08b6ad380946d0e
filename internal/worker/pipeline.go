package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/tracing"
)

// The worker's stages of consumer.NewStaged. The consumer gathers the
// deliveries into batches (up to BatchSize events and BatchBytes of
// declared attachment bytes, Committers transactions at once) and runs,
// per batch:
//
//  1. prepare, outside any transaction: read, without locks, each event's
//     note and attachment — its state, and its bytes when it is pending —
//     in one query, and process the pending attachments, each admitted by
//     its decode weight (attachment.DecodeMemory) under the decode budget
//     (QUILL_WORKER_DECODE_MEMORY) and by a CPU slot (GOMAXPROCS at once).
//     It waits for them until half of the batch's deadline (AckWait); an
//     attachment still processing then is put off (Item.Later): it leaves
//     the batch and is committed alone once it finished, so one slow image
//     delays only its own event.
//  2. the consumer's transaction: BEGIN and the inbox rows (inboxTable);
//     then apply locks the notes and attachments of the fresh events (in
//     note id order, so concurrent batches never deadlock on them),
//     re-checks each attachment's state under the lock, stores the
//     results and writes the attachment.processed events; the consumer
//     forgets the inbox rows of the events that failed on their own and
//     commits.
//  3. committed: count, notify the relays, observe the latency.
//
// No note is locked while its attachment is processed: an API update or
// delete of the note waits only for the writes of step 2. Since an
// attachment's state only moves forward (pending → processed or failed,
// a note only to deleted), the state read in step 1 can only have moved on
// by step 2, which then records the event as a duplicate or skipped.
//
// An event that fails on its own — its note is missing, its processing
// returned an error or panicked — is left out of the writes and only its
// message sees the error; the others commit. Any other failure of the
// transaction, the end of the batch's deadline included, makes the
// consumer handle each event alone, in its own transaction.

// job is what prepare leaves for apply: the event and its attachment's
// processing.
type job struct {
	p parsed
	// proc is the processing of the attachment; nil when it was not
	// pending when read.
	proc *processing
	// state is the note's attachment as read before processing.
	state attState
	// prepared is when its handling began (its span's start).
	prepared time.Time
	// trace is its handling's span context, for its log line.
	trace trace.SpanContext
}

// attState is a note's attachment as read or locked.
type attState struct {
	found   bool
	deleted bool
	attID   uuid.UUID
	status  string
	// opKey is the operation key of the create that made the attachment
	// ("" for attachments made before migration 00016): the
	// attachment.processed event is written under it, so that the
	// create's outcome lookup lists it.
	opKey string
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
const sqlAttachmentsLock = `SELECT n.id, n.deleted_at IS NOT NULL, a.id, a.status, coalesce(a.operation_key, '')
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

// prepare is the consumer's Prepare: step 1 above.
func (w *Worker) prepare(ctx context.Context, items []*consumer.Item) {
	alone := len(items) == 1 && items[0].Alone
	if !alone {
		w.countBatch(len(items))
	}
	var todo []*job
	var todoItems []*consumer.Item
	for _, it := range items {
		p, err := parse(it.Event)
		if err != nil {
			it.Err = consumer.Permanent(err) // validated already: unreachable
			continue
		}
		if h := w.hooks.BeforeProcess; h != nil {
			if err := h(p.id.String(), it.Event.Delivery.Deliveries); err != nil {
				it.Err = err
				continue
			}
		}
		if p.att == nil {
			// Nothing to process; nothing to remember either.
			it.Skip, it.Result = true, metrics.WorkerSkipped
			continue
		}
		j := &job{p: p, prepared: time.Now()}
		it.Prepared = j
		if proc := w.keptProcessing(it.Event.ID); proc != nil {
			// An earlier attempt's: put off by its batch, or its batch
			// failed as a whole. Processing is deterministic and states
			// only move forward, so its result still holds.
			j.proc, j.state = proc, proc.state
			continue
		}
		todo, todoItems = append(todo, j), append(todoItems, it)
	}
	if len(todo) > 0 {
		if err := w.start(ctx, todo); err != nil {
			for _, it := range todoItems {
				it.Err, it.Prepared = err, nil
			}
		}
	}
	w.await(ctx, items, alone)
}

// start reads the attachments of jobs and starts processing those
// pending, one processing per attachment. It returns an error when the
// read failed (nothing was started).
func (w *Worker) start(ctx context.Context, jobs []*job) error {
	ids, tenants := noteArgs(jobs)
	type read struct {
		s    attState
		data []byte
	}
	found := make(map[uuid.UUID]read, len(jobs))
	rows, err := w.pool.Query(ctx, sqlAttachmentsRead, ids, tenants)
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
	for _, j := range jobs {
		r := found[j.p.noteID]
		j.state = r.s
		if !r.s.processable(j) {
			continue
		}
		if p, ok := started[r.s.attID]; ok {
			j.proc = p
			continue
		}
		p := &processing{attID: r.s.attID, state: r.s, done: make(chan struct{})}
		started[r.s.attID], j.proc = p, p
		w.processes.Go(func() { w.process(p, j, r.data) })
	}
	return nil
}

// keptProcessing returns the processing an earlier attempt of event id
// started, or nil; one that failed is not kept (a retry processes again).
// It also forgets the processing finished long ago, of events that
// another worker took over.
func (w *Worker) keptProcessing(id string) *processing {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, p := range w.kept {
		if p.finished(time.Now().Add(-keepProcessing)) {
			delete(w.kept, k)
		}
	}
	p := w.kept[id]
	if p != nil && p.finished(time.Now()) && p.err != nil {
		delete(w.kept, id)
		return nil
	}
	return p
}

// keepProcessing is how long a finished processing is kept for a later
// attempt of its event: past the longest handling of a message.
const keepProcessing = time.Minute

// forget drops the kept processing of events whose effect committed.
func (w *Worker) forget(items []*consumer.Item) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, it := range items {
		delete(w.kept, it.Event.ID)
	}
}

// await waits for the processing of items, and keeps each for the
// event's later attempts until its effect commits. A batch waits until
// half of its deadline and puts off the items still processing then; an
// item alone waits as long as its context allows.
func (w *Worker) await(ctx context.Context, items []*consumer.Item, alone bool) {
	var until <-chan time.Time
	if deadline, ok := ctx.Deadline(); ok && !alone {
		t := time.NewTimer(time.Until(deadline) / 2)
		defer t.Stop()
		until = t.C
	}
	expired := false
	for _, it := range items {
		j, _ := it.Prepared.(*job)
		if j == nil || j.proc == nil {
			continue
		}
		if !expired {
			select {
			case <-j.proc.done:
			case <-until:
				expired = true
			case <-ctx.Done():
				expired = true
			}
		}
		w.mu.Lock()
		w.kept[it.Event.ID] = j.proc
		w.mu.Unlock()
		select {
		case <-j.proc.done:
			continue
		default:
		}
		if alone {
			it.Err = fmt.Errorf("attachment still processing: %w", context.Cause(ctx))
		} else {
			it.Later = true
		}
	}
}

// countBatch records a batch of n events for BatchStats.
func (w *Worker) countBatch(n int) {
	w.batches.Add(1)
	w.jobs.Add(int64(n))
	for l := w.largest.Load(); int64(n) > l && !w.largest.CompareAndSwap(l, int64(n)); l = w.largest.Load() {
	}
}

// process runs p for job j's attachment data under the decode budget and a
// CPU slot.
func (w *Worker) process(p *processing, j *job, data []byte) {
	defer func() {
		p.doneAt = time.Now()
		close(p.done)
	}()
	// An image heavier than the whole budget is refused by
	// attachment.Process without decoding: it waits for nothing.
	weight := min(attachment.DecodeMemory(data), w.cfg.DecodeMemory)
	if weight > 0 {
		// Never fails: the context never ends.
		_ = w.mem.Acquire(context.Background(), weight)
		w.memInUse.Add(float64(weight))
		defer func() {
			w.memInUse.Sub(float64(weight))
			w.mem.Release(weight)
		}()
	}
	w.cpu <- struct{}{}
	defer func() { <-w.cpu }()
	if h := w.hooks.Processing; h != nil {
		h(j.p.id.String())
	}
	lim := w.cfg.Limits
	lim.DecodeMemory = w.cfg.DecodeMemory
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

// processing is the processing of one attachment, outside any
// transaction; its fields are set when done is closed.
type processing struct {
	attID uuid.UUID
	state attState // as read before processing
	done  chan struct{}
	// doneAt is when it finished.
	doneAt time.Time
	ev     ProcessedData
	// result is the metrics result (processed, failed) when err is nil.
	result string
	err    error
	json   []byte
	thumb  []byte
}

// finished reports whether p finished by t.
func (p *processing) finished(t time.Time) bool {
	select {
	case <-p.done:
		return !p.doneAt.After(t)
	default:
		return false
	}
}

// run processes j's attachment data, recovering a panic as the
// processing's own error.
func (p *processing) run(j *job, data []byte, lim attachment.Limits) {
	defer func() {
		if r := recover(); r != nil {
			p.err = fmt.Errorf("process attachment: panic: %v", r)
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
		p.result = metrics.WorkerFailed
	case err != nil:
		p.err = fmt.Errorf("process attachment: %w", err)
	default:
		p.ev.State, p.ev.DetectedType = StateProcessed, res.DetectedType
		if p.json, err = res.JSON(); err != nil {
			p.err = err
			return
		}
		if res.Thumbnail != nil {
			p.thumb = res.Thumbnail.PNG
		}
		p.result = metrics.WorkerProcessed
	}
}

// apply is the consumer's Apply: in tx, which holds the items' inbox rows,
// lock the notes and attachments, re-check, and write. An item's Err is
// its own failure; the error returned fails the transaction.
func (w *Worker) apply(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
	now := w.now().UTC().Truncate(time.Microsecond)
	jobs := make([]*job, len(items))
	for i, it := range items {
		jobs[i] = it.Prepared.(*job)
	}
	ids, tenants := noteArgs(jobs)
	rows, err := tx.Query(ctx, sqlAttachmentsLock, ids, tenants)
	if err != nil {
		return fmt.Errorf("lock attachments: %w", db.Translate(err))
	}
	locked := make(map[uuid.UUID]attState, len(jobs))
	var noteID uuid.UUID
	var s attState
	if _, err := pgx.ForEachRow(rows, []any{&noteID, &s.deleted, &s.attID, &s.status, &s.opKey}, func() error {
		s.found = true
		locked[noteID] = s
		s = attState{}
		return nil
	}); err != nil {
		return fmt.Errorf("lock attachments: %w", db.Translate(err))
	}

	// processedBy maps an attachment to the item processing it in this
	// batch: a second event for it is a duplicate, as one for an
	// attachment no longer pending.
	processedBy := map[uuid.UUID]int{}
	follows := map[int]int{}
	b := &pgx.Batch{}
	var results []notes.AttachmentResult
	for i, it := range items {
		// The handling's span, the child of the event's publish, from
		// when its batch was prepared to its writes; it is the parent of
		// the attachment.processed event written.
		sctx, span := w.startSpan(ctx, it, jobs[i].prepared)
		jobs[i].trace = trace.SpanContextFromContext(sctx)
		err := w.applyOne(sctx, b, it, jobs[i], locked[jobs[i].p.noteID], i, now, processedBy, follows, &results)
		endSpan(span, it, err)
		if err != nil {
			return err
		}
	}
	for i, l := range follows {
		// A second event of one attachment shares the first's fate.
		if err := items[l].Err; err != nil {
			items[i].Err = err
		}
	}
	notes.QueueAttachmentsProcessed(b, now, results)
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("store results: %w", db.Translate(err))
	}
	return nil
}

// applyOne decides and queues the writes of one item, given its note's
// attachment as locked (s); ctx carries the item's span, whose trace
// context the attachment.processed event takes. An item's own failure is
// its Err; the error returned fails the transaction.
func (w *Worker) applyOne(ctx context.Context, b *pgx.Batch, it *consumer.Item, j *job, s attState, i int, now time.Time,
	processedBy map[uuid.UUID]int, follows map[int]int, results *[]notes.AttachmentResult) error {
	switch {
	case !s.found:
		// Notes are never removed (only marked deleted), so the
		// event belongs to another database: nothing here can ever
		// process it.
		it.Err = consumer.Permanent(fmt.Errorf("note %s of tenant %s has no attachment in this database", j.p.noteID, j.p.tenant))
	case s.deleted:
		it.Result = metrics.WorkerSkipped
		notes.QueueAttachmentSkipped(b, s.attID, ReasonNoteDeleted)
	case s.attID != j.p.att.id:
		// A note has one attachment, fixed at its creation: an event
		// naming another was not written by this database's API.
		it.Err = consumer.Permanent(fmt.Errorf("event names attachment %s, but note %s's attachment is %s",
			j.p.att.id, j.p.noteID, s.attID))
	case s.status != notes.AttachmentPending:
		// Processed under another event id, or before the inbox
		// forgot this one: the effect exists, do not repeat it.
		it.Result = metrics.WorkerDuplicate
	case j.proc == nil || j.proc.attID != s.attID:
		// Unreachable while states only move forward: the read
		// before processing saw the attachment no longer pending.
		it.Err = fmt.Errorf("attachment %s is pending again after it was read as %s", s.attID, j.state.status)
	default:
		if l, ok := processedBy[s.attID]; ok {
			follows[i] = l
			it.Result = metrics.WorkerDuplicate
			return nil
		}
		processedBy[s.attID] = i
		p := j.proc
		if p.err != nil {
			it.Err = p.err
			return nil
		}
		it.Result = p.result
		*results = append(*results, notes.AttachmentResult{ID: s.attID, Status: p.ev.State, Result: p.json,
			Reason: p.ev.Reason, Thumbnail: p.thumb})
		// Derived from the note.created event's id (decision 0050): processing
		// it again, after a restore or beyond the inbox's memory, writes the
		// event every consumer has seen already.
		tp, ts := tracing.Inject(ctx)
		if err := outbox.Queue(b, outbox.Event{ID: notes.ProcessedEventID(j.p.id), Tenant: j.p.tenant, OperationKey: s.opKey, AggregateID: j.p.noteID,
			Type: contract.EventAttachmentProcessed, Time: now, Data: p.ev, Traceparent: tp, Tracestate: ts}); err != nil {
			return fmt.Errorf("outbox event: %w", err)
		}
	}
	return nil
}

// eventTrace is a context whose span context is it's handling span's, or
// (an item that never reached apply) its message's, so that its log line
// carries its trace_id.
func eventTrace(it *consumer.Item) context.Context {
	if j, ok := it.Prepared.(*job); ok && j.trace.IsValid() {
		return trace.ContextWithSpanContext(context.Background(), j.trace)
	}
	h := it.Event.Delivery.Header
	return tracing.Extract(context.Background(), h.Get("traceparent"), h.Get("tracestate"))
}

// startSpan starts the span of it's handling (see WithTracer) at start.
func (w *Worker) startSpan(ctx context.Context, it *consumer.Item, start time.Time) (context.Context, trace.Span) {
	return tracing.StartConsumerSpan(ctx, w.tracer, tracing.Header(it.Event.Delivery.Header), "process "+it.Event.Type,
		trace.WithTimestamp(start), trace.WithAttributes(semconv.MessagingSystemKey.String("nats"),
			semconv.MessagingOperationTypeProcess, semconv.MessagingMessageID(it.Event.ID)))
}

// endSpan records it's result or failure (err failing its transaction) on
// span and ends it.
func endSpan(span trace.Span, it *consumer.Item, err error) {
	if it.Result != "" {
		span.SetAttributes(attribute.String("quill.result", it.Result))
	}
	if err == nil {
		err = it.Err
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "event failed")
	}
	span.End()
}

// committed is the consumer's Committed: count each event, wake the
// relays, observe the latency, and run the tests' hook.
func (w *Worker) committed(items []*consumer.Item) {
	w.forget(items)
	at := w.now()
	for _, it := range items {
		if it.Result == metrics.WorkerProcessed || it.Result == metrics.WorkerFailed {
			w.notifier.Signal()
			w.m.EndToEnd.Observe(at.Sub(it.Event.Time).Seconds())
		}
		w.m.Message(it.Result)
		if e := w.log.Debug(); e.Enabled() { // its trace costs an allocation per event
			e.Ctx(eventTrace(it)).Str("event_id", it.Event.ID).Str("tenant", it.Event.Tenant).Str("note_id", it.Event.Subject).
				Str("result", it.Result).Msg("event handled")
		}
		if h := w.hooks.AfterCommit; h != nil && !it.Skip {
			it.Err = h(it.Event.ID)
		}
	}
}
