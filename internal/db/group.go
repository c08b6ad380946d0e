package db

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// Group defaults (decision 0100).
const (
	// GroupMaxBatchDefault is GroupConfig.MaxBatch's default.
	GroupMaxBatchDefault = 64
	// GroupAcquireTimeoutDefault is GroupConfig.AcquireTimeout's default.
	GroupAcquireTimeoutDefault = 5 * time.Second
	// GroupFlushTimeoutDefault is GroupConfig.FlushTimeout's default: as
	// long as one statement may run (StatementTimeout).
	GroupFlushTimeoutDefault = 30 * time.Second
)

// ErrGroupClosed is returned by Do once Close has been called: the
// transaction was not sent.
var ErrGroupClosed = errors.New("transaction group closed")

// ErrReadAfterCommit marks a transaction that committed but one of whose
// result callbacks (GroupStmt.Row, or a pgx.Batch callback) returned an
// error: the callback runs after the statements and their Sync have been
// written, so it cannot undo the commit.
var ErrReadAfterCommit = errors.New("transaction committed; reading a result failed")

// GroupConfig tunes a Group. Every zero field takes its default.
type GroupConfig struct {
	// MaxBatch is the most transactions one flush (one write) carries.
	// Default GroupMaxBatchDefault.
	MaxBatch int
	// Lanes is the most flushes in flight at once, and so the most
	// connections of the pool the group holds at once (each flush
	// acquires one and gives it back). Default: the pool's MaxConns, as
	// many as callers sending one transaction each could hold. On one
	// connection each commit waits for its WAL flush before the next
	// transaction runs, so lanes are what keeps the database's group
	// commit at work; batches form once callers outnumber them.
	Lanes int
	// MaxDelay is how long a free lane lingers for more transactions
	// before it writes a batch smaller than MaxBatch — and only while
	// another lane is in flight, so a lone caller is never delayed.
	// Default 0: a free lane writes whatever is queued at once.
	MaxDelay time.Duration
	// AcquireTimeout bounds a lane's wait for a connection; past it the
	// batch's transactions fail with an error wrapping ErrPoolTimeout
	// (nothing was sent). Default GroupAcquireTimeoutDefault.
	AcquireTimeout time.Duration
	// FlushTimeout bounds a flush from its write to its last transaction's
	// ReadyForQuery. A flush that runs out closes its connection, and
	// every transaction whose outcome was not read gets an
	// *OutcomeUnknownError. Default GroupFlushTimeoutDefault.
	FlushTimeout time.Duration
	// CommitBarrier, when true, makes a flush of several transactions
	// wait for one WAL flush instead of one per transaction: each commits
	// with synchronous_commit off, a last transaction (the barrier) takes
	// an xid and commits with the session's synchronous_commit, which
	// makes every earlier commit of the write durable too, and only then
	// are the transactions answered. Committed rows are visible to other
	// sessions for the moment before the barrier's flush, which a crash
	// in that moment loses (decision 0100). Default false: every
	// transaction commits as the session's synchronous_commit says.
	CommitBarrier bool
	// SharedCommit, when true, makes a flush of several transactions one
	// implicit transaction with one Sync and one commit — one WAL flush,
	// durable before any of them is answered or visible to another
	// session. When one of its statements is refused, the server rolls
	// the whole flush back and the group sends each transaction again with
	// a Sync of its own, so that only the refused one fails (decision
	// 0103). Transactions that share a commit hold their locks until it;
	// ones whose statements could wait for each other's locks must not be
	// carried so. CommitBarrier does not apply to a shared flush.
	SharedCommit bool
}

// CreateGroupConfig is the configuration "api serve" carries creates with
// (decision 0103): a shared commit per flush, on a quarter of the pool's
// connections, so that writes form once a few creates are in flight
// together and each carries several to one WAL flush.
func CreateGroupConfig(maxConns int32) GroupConfig {
	return GroupConfig{Lanes: max(1, int(maxConns)/4), SharedCommit: true}.WithDefaults(maxConns)
}

// WithDefaults returns cfg with every zero field set to its default for a
// pool of maxConns connections.
func (cfg GroupConfig) WithDefaults(maxConns int32) GroupConfig {
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = GroupMaxBatchDefault
	}
	if cfg.Lanes == 0 {
		cfg.Lanes = max(1, int(maxConns))
	}
	if cfg.AcquireTimeout == 0 {
		cfg.AcquireTimeout = GroupAcquireTimeoutDefault
	}
	if cfg.FlushTimeout == 0 {
		cfg.FlushTimeout = GroupFlushTimeoutDefault
	}
	return cfg
}

func (cfg GroupConfig) validate() error {
	switch {
	case cfg.MaxBatch < 1:
		return fmt.Errorf("group: MaxBatch %d must be positive", cfg.MaxBatch)
	case cfg.Lanes < 1:
		return fmt.Errorf("group: Lanes %d must be positive", cfg.Lanes)
	case cfg.MaxDelay < 0:
		return fmt.Errorf("group: MaxDelay %s must not be negative", cfg.MaxDelay)
	case cfg.AcquireTimeout < 0:
		return fmt.Errorf("group: AcquireTimeout %s must not be negative", cfg.AcquireTimeout)
	case cfg.FlushTimeout < 0:
		return fmt.Errorf("group: FlushTimeout %s must not be negative", cfg.FlushTimeout)
	}
	return nil
}

// GroupTx is one transaction for Group.Do: its statements run, in order,
// in one implicit transaction block that their Sync ends — committed when
// none failed, rolled back otherwise. Its statements must not contain
// BEGIN, COMMIT or ROLLBACK.
type GroupTx struct {
	Stmts []GroupStmt
	// LockTimeout, when positive, is the transaction's lock_timeout, set
	// for it alone as WithLockTimeout sets a Pipeline's.
	LockTimeout time.Duration
}

// GroupStmt is one statement of a GroupTx.
type GroupStmt struct {
	SQL string
	// Args are the statement's parameters, encoded as pgx encodes them
	// (no pgx.NamedArgs or other query rewriters).
	Args []any
	// Row, when set, reads the statement's one row (pgx.ErrNoRows when
	// there is none). It runs on the group's own goroutine while later
	// transactions of the same flush wait: it must only scan, never block.
	// Its error cannot roll the transaction back (see ErrReadAfterCommit);
	// a statement whose outcome decides later ones is guarded in SQL (Flag).
	Row func(pgx.Row) error
	// fn is a pgx.Batch callback (GroupTxFromBatch); Row wins.
	fn func(pgx.BatchResults) error
}

// GroupTxFromBatch turns the statements queued on b, with their callbacks
// (QueryRow, Query, Exec), into a GroupTx, so that code that queues a
// transaction's statements on a pgx.Batch sends them through a Group
// unchanged. The callbacks run as GroupStmt.Row does.
func GroupTxFromBatch(b *pgx.Batch) *GroupTx {
	tx := &GroupTx{Stmts: make([]GroupStmt, len(b.QueuedQueries))}
	for i, q := range b.QueuedQueries {
		tx.Stmts[i] = GroupStmt{SQL: q.SQL, Args: q.Arguments}
		if q.Fn != nil {
			tx.Stmts[i].fn = q.Fn
		}
	}
	return tx
}

// GroupStats counts what a Group did since NewGroup.
type GroupStats struct {
	// Flushes is the number of writes, each carrying one or more
	// transactions; Txs the transactions they carried.
	Flushes, Txs uint64
	// MaxBatch is the most transactions one flush carried.
	MaxBatch int
	// Lingered is the number of flushes that waited MaxDelay for more.
	Lingered uint64
	// Committed, Refused and Unknown are the transactions sent whose Do
	// returned nil, the server's refusal, and *OutcomeUnknownError.
	Committed, Refused, Unknown uint64
	// Barriers is the number of flushes that ended with a barrier
	// (CommitBarrier).
	Barriers uint64
	// Unshared is the number of shared flushes (SharedCommit) that a
	// refusal rolled back, sent again one transaction per Sync.
	Unshared uint64
	// Withdrawn is the transactions whose caller's context ended while
	// they were still queued: never sent.
	Withdrawn uint64
	// Queued is the transactions waiting for a lane now (withdrawn ones
	// included until a lane skips them).
	Queued int
}

// Group carries the independent transactions of concurrent callers
// through one pooled connection per flush: each transaction's statements
// and a Sync, back to back, in one write, whose results are read back in
// one pass — so one write and one read serve many transactions, each
// still committed or rolled back on its own. At most Lanes flushes are
// in flight; a caller that finds a lane free (and no reason to linger)
// flushes in its own goroutine whatever is queued, itself included, and
// the others queue for the lanes' goroutines, each of which takes up to
// MaxBatch at once when it is free. See decision 0100. Safe for
// concurrent use; Close it to stop it.
type Group struct {
	pool *pgxpool.Pool
	cfg  GroupConfig
	// named: statements are prepared once per connection under a name
	// (pgx's cache_statement mode); otherwise each is parsed unnamed in
	// the write that runs it, as pgx's cache_describe mode does, so that
	// none has to outlive its transaction's backend behind a pooler.
	named bool
	// typed: the pool's query mode describes statements, so NewArgs's
	// parameters are kept in the slab.
	typed bool

	mu sync.Mutex
	// cond wakes a lane's goroutine: something was queued, a lane was
	// freed, the group closed, a linger ran out.
	cond  *sync.Cond
	queue []*groupReq
	busy  int // lanes flushing (or lingering), at most cfg.Lanes
	// pending counts the flushes whose answers are still to come: what
	// "another flush in flight" means for lingering. A flush stops
	// counting before its last answer, so that a caller who sends again
	// at once is not made to linger behind its own flush's tail.
	pending int
	closed  bool

	lanes sync.WaitGroup // the lanes' goroutines and callers' flushes
	spare sync.Pool      // *laneState for callers that flush themselves
	// free holds the slots of the lanes not in flight; the watchdog
	// checks every slot's flush against its deadline.
	slots, free []*flushSlot
	stop        chan struct{}
	stopOnce    sync.Once
	watchdog    sync.WaitGroup

	flushes, txs, lingered, barriers       atomic.Uint64
	unshares                               atomic.Uint64
	committed, refused, unknown, withdrawn atomic.Uint64
	maxBatch                               atomic.Int64
}

// NewGroup starts a Group on pool with cfg (zero fields take their
// defaults). It returns an error naming the field when cfg is invalid.
func NewGroup(pool *pgxpool.Pool, cfg GroupConfig) (*Group, error) {
	cfg = cfg.WithDefaults(pool.Config().MaxConns)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &Group{
		pool:  pool,
		cfg:   cfg,
		named: pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement,
		typed: describes(pool.Config().ConnConfig.DefaultQueryExecMode),
	}
	g.cond = sync.NewCond(&g.mu)
	g.spare.New = func() any { return &laneState{g: g} }
	g.stop = make(chan struct{})
	for range cfg.Lanes {
		g.slots = append(g.slots, &flushSlot{})
	}
	g.free = append(g.free, g.slots...)
	g.watchdog.Go(g.watch)
	for range cfg.Lanes {
		g.lanes.Go(g.lane)
	}
	return g, nil
}

// Request states: a lane moves a request from queued to sent only once it
// holds a connection, so a caller whose context ends before then withdraws
// it (queued to withdrawn) and nothing of it is written.
const (
	reqQueued int32 = iota
	reqSent
	reqWithdrawn
	reqAnswered
)

type groupReq struct {
	tx    *GroupTx
	state atomic.Int32
	res   chan error
	at    time.Time // queued, for MaxDelay
	// pid and xactStart are the backend's pid and the transaction's
	// start read with the session settings behind a pooler.
	pid       uint32
	xactStart time.Time
	// held: committed, its answer (outcome) waits for the barrier.
	held    bool
	outcome error
}

// Do runs tx in the next flush of a free lane and returns its outcome:
// nil when it committed; the translated error (Translate) when the server
// refused one of its statements or its commit, in which case nothing of
// it was committed; an *OutcomeUnknownError when the connection failed
// (or FlushTimeout ran out) after tx was written and before its outcome
// was read — Recheck establishes it; an error wrapping ErrReadAfterCommit
// when it committed but a result callback failed; an error wrapping
// ErrPoolTimeout or ErrUnavailable when no connection could be had (not
// sent); ErrGroupClosed after Close (not sent). When ctx ends while tx is
// still queued, tx is never sent and Do returns an error wrapping ctx's;
// once tx is sent Do waits for its outcome whatever ctx does (at most
// FlushTimeout), because the shared connection is never cancelled for one
// caller. A caller that flushes in its own goroutine sends at once (after
// at most AcquireTimeout for a connection).
func (g *Group) Do(ctx context.Context, tx *GroupTx) (err error) {
	// The transaction's span, as a Pipeline's (startSpan): only under a
	// recording span of the caller's.
	if span := startSpan(ctx); span != nil {
		span.SetAttributes(attribute.Bool("quill.db.group", true))
		defer func() {
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}()
	}
	r := &groupReq{tx: tx, res: make(chan error, 1)}
	if g.cfg.MaxDelay > 0 {
		r.at = time.Now()
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return ErrGroupClosed
	}
	if err := ctx.Err(); err != nil {
		g.mu.Unlock()
		return fmt.Errorf("transaction not sent: %w", err)
	}
	g.queue = append(g.queue, r)
	if g.busy < g.cfg.Lanes && len(g.queue) <= g.cfg.MaxBatch && (g.cfg.MaxDelay == 0 || g.pending == 0) {
		// A free lane and no reason to linger: this goroutine is the
		// lane, which spares the hand-offs to a lane's goroutine and back.
		l := g.spare.Get().(*laneState)
		l.batch = g.takeLocked(l.batch[:0])
		g.busy++
		g.pending++
		l.slot = g.takeSlot()
		// Close waits for this flush as for the lanes' goroutines (and
		// the watchdog outlives it): the Add happens under g.mu before
		// Close can see closed and wait.
		g.lanes.Add(1)
		g.mu.Unlock()
		g.run(l)
		g.lanes.Done()
		g.spare.Put(l)
		return <-r.res
	}
	g.cond.Signal()
	g.mu.Unlock()
	select {
	case err := <-r.res:
		return err
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqQueued, reqWithdrawn) {
			g.withdrawn.Add(1)
			return fmt.Errorf("transaction not sent: %w", ctx.Err())
		}
		return <-r.res
	}
}

// NewArgs returns an Args for one transaction this group carries, typed as
// the pool's query mode allows (see Args).
func (g *Group) NewArgs() *Args { return &Args{typed: g.typed} }

// Stats returns what the group did so far.
func (g *Group) Stats() GroupStats {
	g.mu.Lock()
	queued := len(g.queue)
	g.mu.Unlock()
	return GroupStats{Queued: queued,
		Flushes: g.flushes.Load(), Txs: g.txs.Load(), MaxBatch: int(g.maxBatch.Load()),
		Lingered: g.lingered.Load(), Barriers: g.barriers.Load(), Committed: g.committed.Load(), Refused: g.refused.Load(),
		Unknown: g.unknown.Load(), Withdrawn: g.withdrawn.Load(), Unshared: g.unshares.Load(),
	}
}

// Close stops the group: Do refuses new transactions with ErrGroupClosed,
// the lanes send every transaction still queued (a daemon's shutdown
// drains), and Close returns once they have all been answered and the
// lanes' goroutines have ended. Calling it again waits the same way.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.cond.Broadcast()
	g.mu.Unlock()
	g.lanes.Wait()
	g.stopOnce.Do(func() { close(g.stop) })
	g.watchdog.Wait()
}

// watch ends, by a past deadline on its connection, every flush that runs
// past FlushTimeout, checking a few times per FlushTimeout: one timer for
// the group instead of one per flush.
func (g *Group) watch() {
	t := time.NewTicker(min(max(g.cfg.FlushTimeout/8, 5*time.Millisecond), time.Second))
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case now := <-t.C:
			for _, s := range g.slots {
				s.check(now)
			}
		}
	}
}

// flushSlot is one lane's flush on the wire, for the watchdog.
type flushSlot struct {
	mu       sync.Mutex
	conn     net.Conn // nil: no flush on the wire
	deadline time.Time
	fired    bool
}

func (s *flushSlot) arm(c net.Conn, deadline time.Time) {
	s.mu.Lock()
	s.conn, s.deadline, s.fired = c, deadline, false
	s.mu.Unlock()
}

// disarm ends the watch and reports whether the deadline fired: then the
// connection has a past deadline and must not go back to the pool.
func (s *flushSlot) disarm() bool {
	s.mu.Lock()
	fired := s.fired
	s.conn, s.fired = nil, false
	s.mu.Unlock()
	return fired
}

// check fails the flush's reads and writes once its deadline passed.
func (s *flushSlot) check(now time.Time) {
	s.mu.Lock()
	if s.conn != nil && !s.fired && now.After(s.deadline) {
		s.fired = true
		_ = s.conn.SetDeadline(now)
	}
	s.mu.Unlock()
}

// lane is a goroutine that flushes what callers queued while every lane
// was busy (or lingering made sense), until the group is closed and
// drained.
func (g *Group) lane() {
	l := &laneState{g: g}
	for {
		batch, slot, ok := g.take(l.batch[:0])
		if !ok {
			return
		}
		l.batch, l.slot = batch, slot
		g.run(l)
	}
}

// run flushes l.batch, for which the caller took a lane (g.busy,
// g.pending and a slot), and frees the lane once its connection is back.
func (g *Group) run(l *laneState) {
	l.pending, l.remaining = true, 0
	g.flush(l)
	// Drop the answered requests and their arguments.
	clear(l.batch)
	clear(l.sent)
	clear(l.stmts)
	l.batch, l.sent, l.stmts = l.batch[:0], l.sent[:0], l.stmts[:0]
	g.mu.Lock()
	if l.pending {
		l.pending = false
		g.pending--
	}
	g.busy--
	g.free = append(g.free, l.slot)
	l.slot = nil
	if len(g.queue) > 0 {
		g.cond.Signal()
	}
	g.mu.Unlock()
}

// answered takes the flush out of g.pending, once.
func (l *laneState) answered() {
	if l.pending {
		l.pending = false
		l.g.mu.Lock()
		l.g.pending--
		l.g.mu.Unlock()
	}
}

// take waits for queued transactions and a free lane, and takes up to
// MaxBatch of them, skipping withdrawn ones. It returns false once the
// group is closed and nothing is queued.
func (g *Group) take(batch []*groupReq) ([]*groupReq, *flushSlot, bool) {
	g.mu.Lock()
	for {
		if g.busy < g.cfg.Lanes {
			if batch = g.takeLocked(batch); len(batch) > 0 {
				break
			}
		}
		if g.closed && len(g.queue) == 0 {
			g.mu.Unlock()
			return nil, nil, false
		}
		g.cond.Wait()
	}
	// The lane is taken before lingering, so that Lanes bounds the
	// connections whatever callers do meanwhile.
	inFlight := g.pending > 0
	g.busy++
	g.pending++
	slot := g.takeSlot()
	if g.cfg.MaxDelay > 0 && len(batch) < g.cfg.MaxBatch && inFlight {
		batch = g.linger(batch)
	}
	if len(g.queue) > 0 && g.busy < g.cfg.Lanes {
		g.cond.Signal()
	}
	g.mu.Unlock()
	return batch, slot, true
}

// takeSlot takes a free lane's slot; g.mu is held and g.busy counts the
// lane already, so one is free.
func (g *Group) takeSlot() *flushSlot {
	s := g.free[len(g.free)-1]
	g.free = g.free[:len(g.free)-1]
	return s
}

// takeLocked moves up to MaxBatch queued requests from the queue to batch.
func (g *Group) takeLocked(batch []*groupReq) []*groupReq {
	n := 0
	for n < len(g.queue) && len(batch) < g.cfg.MaxBatch {
		r := g.queue[n]
		n++
		if r.state.Load() == reqQueued {
			batch = append(batch, r)
		}
	}
	k := copy(g.queue, g.queue[n:])
	clear(g.queue[k:])
	g.queue = g.queue[:k]
	return batch
}

// linger waits, with g.mu held on entry and exit, until the batch is full
// or MaxDelay has passed since its oldest transaction was queued.
func (g *Group) linger(batch []*groupReq) []*groupReq {
	g.lingered.Add(1)
	deadline := batch[0].at.Add(g.cfg.MaxDelay)
	t := time.AfterFunc(time.Until(deadline), func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer t.Stop()
	for len(batch) < g.cfg.MaxBatch && !g.closed && time.Now().Before(deadline) {
		g.cond.Wait()
		batch = g.takeLocked(batch)
	}
	return batch
}

// laneState is a lane's scratch, reused from flush to flush.
type laneState struct {
	g *Group
	// pending: the flush counts in g.pending; remaining is how many of
	// its requests are still to be answered.
	pending   bool
	remaining int
	// barrier: this flush's transactions commit asynchronously and a
	// barrier ends it (CommitBarrier); barrierSD is its statement.
	barrier bool
	// unshared: this flush sends each transaction with its own Sync
	// although SharedCommit is set (a shared one was refused).
	unshared  bool
	barrierSD *pgconn.StatementDescription
	// slot is the lane's, while it is in flight.
	slot  *flushSlot
	batch []*groupReq
	sent  []*groupReq
	stmts []groupStmt
	sds   []*pgconn.StatementDescription
	// enc encodes a transaction's parameters, its buffers kept from one
	// to the next.
	enc argEncoder
}

// groupStmt is a statement as sent: the group's own (session settings,
// lock timeout) or the caller's.
type groupStmt struct {
	sql  string
	args []any
	read func(pgx.BatchResults) error
}

// stmts lists what r sends, in order: behind a pooler the session
// settings (with the isolation guard), then the lock timeout, then the
// caller's statements.
func (l *laneState) stmtsOf(r *groupReq, pooled bool) []groupStmt {
	s := l.stmts[:0]
	if l.barrier {
		s = append(s, groupStmt{sql: sqlAsyncCommit})
	}
	if pooled {
		s = append(s, groupStmt{sql: sqlGroupSessionSettings, read: func(br pgx.BatchResults) error {
			var discard1, discard2, discard3 any
			return br.QueryRow().Scan(&r.pid, &r.xactStart, &discard1, &discard2, &discard3)
		}})
	}
	if d := r.tx.LockTimeout; d > 0 {
		s = append(s, groupStmt{sql: sqlLockTimeout, args: []any{strconv.FormatInt(d.Milliseconds(), 10)}})
	}
	for i := range r.tx.Stmts {
		st := &r.tx.Stmts[i]
		gs := groupStmt{sql: st.SQL, args: st.Args, read: st.fn}
		if row := st.Row; row != nil {
			gs.read = func(br pgx.BatchResults) error { return row(br.QueryRow()) }
		}
		s = append(s, gs)
	}
	l.stmts = s
	return s
}

// sqlAsyncCommit lets the transaction's commit return before its WAL is
// flushed; the barrier's flush covers it (CommitBarrier).
const sqlAsyncCommit = `SELECT set_config('synchronous_commit', 'off', true)`

// sqlBarrier takes an xid, so that its commit writes a commit record and,
// under the session's synchronous_commit, waits until the WAL is flushed
// up to it — and so past every commit written before it.
const sqlBarrier = `SELECT pg_current_xact_id()`

// sqlGroupSessionSettings is sqlSessionSettings with a guard that fails
// the transaction unless it runs READ COMMITTED: behind a transaction
// pooler each transaction may reach another backend, whose session default
// another client may have changed, and an implicit transaction block takes
// the session's default isolation (there is no BEGIN to pin it). The cast
// of the message fails only when the CASE takes that branch.
const sqlGroupSessionSettings = sqlSessionSettings + `,
	CASE WHEN current_setting('transaction_isolation') <> 'read committed'
	THEN ('transaction isolation is ' || current_setting('transaction_isolation') || ', not read committed')::int END`

// sqlGroupReadCommitted makes READ COMMITTED the default isolation of a
// direct session whose default is another, so that its implicit
// transaction blocks run READ COMMITTED as Pipeline's BEGIN pins it.
// Quill's other transactions on the session name their own isolation.
const sqlGroupReadCommitted = `SELECT CASE WHEN current_setting('default_transaction_isolation') <> 'read committed'
	THEN set_config('default_transaction_isolation', 'read committed', false) END`

// CustomData keys of a connection the group used: the isolation was made
// READ COMMITTED; its statements' descriptions (prepared or unnamed).
const (
	groupReadCommittedKey = "quill.group.read_committed"
	groupDescribedKey     = "quill.group.described"
)

// flush sends l.batch on one connection and answers each of its requests.
func (g *Group) flush(l *laneState) {
	// The pipeline runs on a context without deadline, so that pgconn
	// watches nothing; the watchdog bounds it (FlushTimeout).
	ctx := context.Background()
	conn, err := Acquire(ctx, g.pool, g.cfg.AcquireTimeout)
	if err != nil {
		for _, r := range l.batch {
			if r.state.CompareAndSwap(reqQueued, reqAnswered) {
				r.res <- err
			}
		}
		return
	}
	sent := l.sent[:0]
	for _, r := range l.batch {
		if r.state.CompareAndSwap(reqQueued, reqSent) {
			sent = append(sent, r)
		}
	}
	l.sent = sent
	l.remaining = len(sent)
	l.barrier = g.cfg.CommitBarrier && len(sent) > 1
	if len(sent) == 0 {
		conn.Release()
		return
	}
	c := conn.Conn()
	pooled := c.PgConn().CustomData()[pooledKey] == true
	if err := g.prepare(l, c, pooled); err != nil {
		// Nothing was written: every transaction still waiting fails.
		err = fmt.Errorf("prepare statements: %w", Translate(err))
		for _, r := range l.batch {
			if r.state.Load() == reqSent {
				l.answer(r, err)
			}
		}
		closeConn(ctx, conn)
		return
	}
	if len(l.sent) == 0 {
		conn.Release()
		return
	}
	l.slot.arm(c.PgConn().Conn(), time.Now().Add(g.cfg.FlushTimeout))
	healthy := g.send(l, conn, pooled)
	if l.slot.disarm() || !healthy {
		closeConn(ctx, conn)
		return
	}
	conn.Release()
}

// prepare makes the session READ COMMITTED (once per direct connection)
// and describes every statement of l.sent the connection has not seen,
// in round trips before the write. A statement the server refuses fails
// its own transaction, which is then not sent; any other error is the
// connection's and is returned.
func (g *Group) prepare(l *laneState, c *pgx.Conn, pooled bool) error {
	// Round trips are rare (a connection's first flushes), and so is the
	// timer that bounds them.
	var rt context.Context
	cancel := context.CancelFunc(func() {})
	defer func() { cancel() }()
	ctx := func() context.Context {
		if rt == nil {
			rt, cancel = context.WithTimeout(context.Background(), g.cfg.FlushTimeout)
		}
		return rt
	}
	data := c.PgConn().CustomData()
	if !pooled && data[groupReadCommittedKey] != true {
		if _, err := c.Exec(ctx(), sqlGroupReadCommitted, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("read committed: %w", err)
		}
		data[groupReadCommittedKey] = true
	}
	described, _ := data[groupDescribedKey].(map[string]*pgconn.StatementDescription)
	if described == nil {
		described = make(map[string]*pgconn.StatementDescription)
		data[groupDescribedKey] = described
	}
	sds := l.sds[:0]
	keep := l.sent[:0]
	for _, r := range l.sent {
		n := len(sds)
		var refused error
		for _, st := range l.stmtsOf(r, pooled) {
			sd, err := g.describe(ctx, c, described, st.sql)
			if err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || sessionEnded(pgErr) {
					l.sds = sds
					l.sent = keep
					return err
				}
				refused = err
				break
			}
			sds = append(sds, sd)
		}
		if refused != nil {
			sds = sds[:n]
			l.answer(r, fmt.Errorf("prepare: %w", Translate(refused)))
			continue
		}
		keep = append(keep, r)
	}
	clear(l.sent[len(keep):])
	l.sent = keep
	l.sds = sds
	if l.barrier {
		sd, err := g.describe(ctx, c, described, sqlBarrier)
		if err != nil {
			return err
		}
		l.barrierSD = sd
	}
	return nil
}

// describe returns the description of sql on c: prepared under a name
// once per connection (pgx keeps it), or described once per connection
// and parsed unnamed in each write.
func (g *Group) describe(ctx func() context.Context, c *pgx.Conn, described map[string]*pgconn.StatementDescription, sql string) (*pgconn.StatementDescription, error) {
	if sd, ok := described[sql]; ok {
		return sd, nil
	}
	var sd *pgconn.StatementDescription
	var err error
	if g.named {
		sd, err = c.Prepare(ctx(), sql, sql)
	} else {
		sd, err = c.PgConn().Prepare(ctx(), "", sql, nil)
	}
	if err != nil {
		return nil, err
	}
	described[sql] = sd
	return sd, nil
}

// answer delivers r's outcome and counts it; before the flush's last
// answer it leaves g.pending.
func (l *laneState) answer(r *groupReq, err error) {
	g := l.g
	r.state.Store(reqAnswered)
	if l.remaining > 0 {
		l.remaining--
		if l.remaining == 0 {
			l.answered()
		}
	}
	var lost *OutcomeUnknownError
	switch {
	case err == nil || errors.Is(err, ErrReadAfterCommit):
		g.committed.Add(1)
	case errors.As(err, &lost):
		g.unknown.Add(1)
	default:
		g.refused.Add(1)
	}
	r.res <- err
}

// send writes l.sent's transactions, each its statements and a Sync, in
// one write on conn, and reads their outcomes in order. It reports whether
// the connection can be used again.
func (g *Group) send(l *laneState, conn *pgxpool.Conn, pooled bool) bool {
	shared := g.cfg.SharedCommit && !l.unshared && len(l.sent) > 1
	if shared {
		l.barrier = false
	}
	c := conn.Conn()
	tm := c.TypeMap()
	pl := c.PgConn().StartPipeline(context.Background())
	// Encode every statement of a transaction before sending any: a
	// transaction whose arguments do not encode is refused whole.
	written := l.sent[:0]
	k := 0
	for _, r := range l.sent {
		stmts := l.stmtsOf(r, pooled)
		sds := l.sds[k : k+len(stmts)]
		k += len(stmts)
		l.enc.reset()
		var encErr error
		for i, st := range stmts {
			if err := l.enc.add(tm, sds[i], st.args); err != nil {
				encErr = fmt.Errorf("encode arguments of statement %d: %w", i, err)
				break
			}
		}
		if encErr != nil {
			l.answer(r, encErr)
			continue
		}
		for i, sd := range sds {
			values, formats, results := l.enc.stmt(i)
			sendStmt(pl, sd, values, formats, results)
		}
		if !shared {
			pl.SendPipelineSync()
		}
		written = append(written, r)
	}
	clear(l.sent[len(written):])
	l.sent = written
	if len(written) == 0 {
		return pl.Close() == nil
	}
	if shared {
		pl.SendPipelineSync()
	}
	if l.barrier {
		sendStmt(pl, l.barrierSD, nil, nil, nil)
		pl.SendPipelineSync()
		g.barriers.Add(1)
	}
	if !l.unshared { // a shared flush sent again is counted once, and in Unshared
		g.flushes.Add(1)
		g.txs.Add(uint64(len(written)))
	}
	for n := int64(len(written)); ; {
		m := g.maxBatch.Load()
		if n <= m || g.maxBatch.CompareAndSwap(m, n) {
			break
		}
	}
	if err := pl.Flush(); err != nil {
		// pgconn closed the connection. Part of the write may have
		// reached the server unless the error says none did.
		if pgconn.SafeToRetry(err) {
			err = fmt.Errorf("send transactions: %w", Translate(err))
			for _, r := range written {
				l.answer(r, err)
			}
		} else {
			l.lost(conn, written, pooled, err)
		}
		return false
	}
	one := &oneResult{tm: tm}
	if shared {
		refused, readErrs, connErr := l.readShared(pl, one, written, pooled)
		if connErr != nil {
			l.lost(conn, written, pooled, connErr)
			_ = pl.Close()
			return false
		}
		if refused {
			// Rolled back whole at the Sync: each again, on its own.
			g.unshares.Add(1)
			if err := pl.Close(); err != nil {
				l.lost(conn, written, pooled, err)
				return false
			}
			l.unshared = true
			defer func() { l.unshared = false }()
			return g.send(l, conn, pooled)
		}
		for i, r := range written {
			l.answer(r, readErrs[i])
		}
		return pl.Close() == nil
	}
	for _, r := range written {
		if !l.read(pl, one, l.stmtsOf(r, pooled), r) {
			l.lost(conn, written, pooled, one.connErr)
			_ = pl.Close()
			return false
		}
	}
	if l.barrier {
		if err := readBarrier(pl); err != nil {
			// The held commits happened but may not be durable.
			l.lost(conn, written, pooled, fmt.Errorf("commit barrier: %w", err))
			_ = pl.Close()
			return false
		}
		for _, r := range written {
			if r.held && r.state.Load() == reqSent {
				l.answer(r, r.outcome)
			}
		}
	}
	return pl.Close() == nil
}

// readShared reads the results of a shared flush's transactions (rs, in
// order) and its one Sync. refused says that the server refused a
// statement, and so rolled back every transaction of the flush; otherwise
// all committed, and readErrs[i] is rs[i]'s ErrReadAfterCommit, if any.
// connErr is the connection's failure before the Sync was read.
func (l *laneState) readShared(pl *pgconn.Pipeline, one *oneResult, rs []*groupReq, pooled bool) (refused bool, readErrs []error, connErr error) {
	readErrs = make([]error, len(rs))
read:
	for k, r := range rs {
		for i, st := range l.stmtsOf(r, pooled) {
			res, err := pl.GetResults()
			if err == nil {
				rr, ok := res.(*pgconn.ResultReader)
				if !ok {
					return false, nil, fmt.Errorf("pipeline: statement %d answered %T", i, res)
				}
				one.rr = rr
				if st.read != nil {
					if e := st.read(one); e != nil && readErrs[k] == nil {
						readErrs[k] = fmt.Errorf("%w: statement %d: %w", ErrReadAfterCommit, i, e)
					}
				}
				_, err = rr.Close()
			}
			if err != nil {
				if !refusal(err) {
					return false, nil, err
				}
				refused = true
				break read
			}
		}
	}
	for {
		// After a refusal pgconn skips the rest up to the Sync; an error
		// here is the commit's own.
		res, err := pl.GetResults()
		if err != nil {
			if !refusal(err) {
				return false, nil, err
			}
			refused = true
			continue
		}
		if _, ok := res.(*pgconn.PipelineSync); !ok {
			return false, nil, fmt.Errorf("pipeline: expected Sync, got %T", res)
		}
		return refused, readErrs, nil
	}
}

// read reads the results of r's statements and its Sync and answers r.
// It returns false, with one.connErr set, when the connection failed (or
// the server ended the session) before r's outcome was read; r is then
// unanswered unless the server had refused it already.
func (l *laneState) read(pl *pgconn.Pipeline, one *oneResult, stmts []groupStmt, r *groupReq) bool {
	var refused, readErr error
	for i, st := range stmts {
		res, err := pl.GetResults()
		if err == nil {
			rr, ok := res.(*pgconn.ResultReader)
			if !ok {
				one.connErr = fmt.Errorf("pipeline: statement %d answered %T", i, res)
				return false
			}
			one.rr = rr
			if st.read != nil {
				if e := st.read(one); e != nil && readErr == nil {
					readErr = fmt.Errorf("statement %d: %w", i, e)
				}
			}
			_, err = rr.Close()
		}
		if err != nil {
			if !refusal(err) {
				one.connErr = err
				return false
			}
			refused = err
			break
		}
	}
	for {
		// After a refusal pgconn skips the transaction's other statements
		// up to its Sync. An error here is the commit's own (a deferred
		// constraint); its Sync follows.
		res, err := pl.GetResults()
		if err != nil {
			if !refusal(err) {
				if refused != nil {
					// Refused is known: the server rolled it back.
					l.answer(r, Translate(refused))
				}
				one.connErr = err
				return false
			}
			if refused == nil {
				refused = err
			}
			continue
		}
		if _, ok := res.(*pgconn.PipelineSync); !ok {
			one.connErr = fmt.Errorf("pipeline: expected Sync, got %T", res)
			return false
		}
		break
	}
	switch {
	case refused != nil:
		l.answer(r, Translate(refused))
	case l.barrier:
		r.held = true
		if readErr != nil {
			r.outcome = fmt.Errorf("%w: %w", ErrReadAfterCommit, readErr)
		}
	case readErr != nil:
		l.answer(r, fmt.Errorf("%w: %w", ErrReadAfterCommit, readErr))
	default:
		l.answer(r, nil)
	}
	return true
}

// sendStmt queues a statement: bound to its prepared name, or parsed
// unnamed with its described parameter types. A prepared statement that
// returns rows has them read by the description kept since it was
// prepared: SendQueryPrepared would have the server describe it again in
// every write, a RowDescription of each of its columns that pgconn
// converts (13 allocations per create). One that returns none is still
// described by the server: pgconn's SendQueryStatement would describe it
// too, and then misreads a refused transaction's NoData.
func sendStmt(pl *pgconn.Pipeline, sd *pgconn.StatementDescription, values [][]byte, formats, resultFormats []int16) {
	switch {
	case sd.Name != "" && len(sd.Fields) > 0:
		pl.SendQueryStatement(sd, values, formats, resultFormats)
	case sd.Name != "":
		pl.SendQueryPrepared(sd.Name, values, formats, resultFormats)
	default:
		pl.SendQueryParams(sd.SQL, values, sd.ParamOIDs, formats, resultFormats)
	}
}

// readBarrier reads the barrier's result and its Sync: nil once its
// commit returned, and with it every earlier commit of the write is
// durable.
func readBarrier(pl *pgconn.Pipeline) error {
	res, err := pl.GetResults()
	if err != nil {
		return err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return fmt.Errorf("pipeline: barrier answered %T", res)
	}
	if _, err := rr.Close(); err != nil {
		return err
	}
	res, err = pl.GetResults()
	if err != nil {
		return err
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		return fmt.Errorf("pipeline: expected Sync, got %T", res)
	}
	return nil
}

// refusal reports whether err is the server refusing a statement, the
// session going on; anything else is the connection's failure.
func refusal(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !sessionEnded(pgErr)
}

// lost answers every request of rs whose outcome was not read with an
// *OutcomeUnknownError, as Pipeline.Commit fills it.
func (l *laneState) lost(conn *pgxpool.Conn, rs []*groupReq, pooled bool, cause error) {
	since := sessionStart(conn)
	err := Translate(cause)
	for _, r := range rs {
		if r.state.Load() != reqSent {
			continue
		}
		e := &OutcomeUnknownError{PID: r.pid, SessionStart: since, XactStart: r.xactStart, Err: err}
		if !pooled {
			e.PID, e.XactStart = conn.Conn().PgConn().PID(), time.Time{}
		}
		l.answer(r, e)
	}
}

// closeConn closes a connection whose state is unknown and gives it back,
// so the pool drops it.
func closeConn(ctx context.Context, conn *pgxpool.Conn) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = conn.Conn().Close(cctx)
	conn.Release()
}

// oneResult is the pgx.BatchResults of one statement of a pipeline, so
// that pgx.Batch callbacks and pgx.Row scanners read it unchanged.
type oneResult struct {
	tm      *pgtype.Map
	rr      *pgconn.ResultReader
	connErr error
}

func (o *oneResult) Exec() (pgconn.CommandTag, error) { return o.rr.Close() }

func (o *oneResult) Query() (pgx.Rows, error) { return pgx.RowsFromResultReader(o.tm, o.rr), nil }

func (o *oneResult) QueryRow() pgx.Row {
	rows, _ := o.Query()
	return oneRow{rows}
}

func (o *oneResult) Close() error {
	_, err := o.rr.Close()
	return err
}

// Tx is nil: a group's transaction is an implicit block, begun by no
// BEGIN.
func (o *oneResult) Tx() pgx.Tx { return nil }

// oneRow is pgx's QueryRow over a statement's rows: the first row, or
// pgx.ErrNoRows.
type oneRow struct{ rows pgx.Rows }

func (r oneRow) Scan(dest ...any) error {
	rows := r.rows
	if rows.Err() != nil {
		return rows.Err()
	}
	if !rows.Next() {
		if rows.Err() == nil {
			return pgx.ErrNoRows
		}
		return rows.Err()
	}
	_ = rows.Scan(dest...)
	rows.Close()
	return rows.Err()
}
