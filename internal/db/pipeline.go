package db

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/internal/wait"
)

const (
	// Pinned, whatever the session's default: Quill's claims and row locks
	// rely on READ COMMITTED (a statement sees the rows committed before it
	// started; a unique check sees every committed row).
	sqlBegin    = "BEGIN ISOLATION LEVEL READ COMMITTED"
	sqlCommit   = "COMMIT"
	sqlRollback = "ROLLBACK"
)

// Pipeline is one READ COMMITTED transaction on one pooled connection whose
// statements travel in as few round trips as the caller allows: BEGIN goes
// out with the first batch sent, COMMIT with the last, so a transaction
// whose statements are all known in advance is one round trip. Behind a
// pooler Quill's session settings are applied in that first round trip, to
// this transaction alone (see sqlSessionSettings). Use it from
// one goroutine; end it with Commit or Rollback, then Release.
type Pipeline struct {
	conn *pgxpool.Conn
	// since bounds the session's start on the database's clock, so that
	// a pid reused by a later session is never taken for this one (see
	// OutcomeUnknownError).
	since time.Time
	// pid is the backend's and xactStart the transaction's start, read
	// with the session settings in the first round trip behind a pooler
	// (whose backend key is its own, and which hands the backend to other
	// clients once the transaction ends); zero on a direct connection,
	// whose key names the backend.
	pid       uint32
	xactStart time.Time
	// b holds the statements not sent yet, BEGIN first until the first
	// send; queued is the backing of its first statements, so that a
	// transaction of a few makes no slice for them.
	b      pgx.Batch
	queued [6]*pgx.QueuedQuery
	// sent: a round trip carried the transaction's first statements, so
	// BEGIN went out.
	sent bool
	// implicit: the session's default isolation is READ COMMITTED
	// (implicitKey), so a transaction whose every statement goes in the
	// round trip of Commit is sent without BEGIN and COMMIT.
	implicit bool
	// direct sends that transaction through pgconn itself (directKey);
	// nil on a connection that sends through pgx.Batch.
	direct *directConn
	// discard: the connection's kept descriptions went stale (a
	// statement's result type changed), so Release closes it.
	discard bool
	// released: the connection went back to the pool (or was closed).
	released bool
	// span is the transaction's span, nil when the caller's context
	// holds no recording span; Release ends it.
	span trace.Span
	// args holds the statements' parameters (Args).
	args Args
	// ac is the attempt's context when the transaction began in one: its
	// end sets a past deadline on the connection (AttemptContext.watch),
	// and pgx is handed its values alone (pgx).
	ac *AttemptContext
}

// Args is where the transaction's statements' parameters are kept; they
// stay valid until Release.
func (p *Pipeline) Args() *Args { return &p.args }

// tracerScope names the instrumentation of the transactions' spans.
const tracerScope = "github.com/quillhq/quill/internal/db"

// startSpan starts the span of a transaction as a child of the caller's
// span, and only when that one is recording: an untraced request costs
// nothing here, and the tracer is the caller's span's own, so no tracer is
// configured for the package.
func startSpan(ctx context.Context) trace.Span {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return nil
	}
	_, span := parent.TracerProvider().Tracer(tracerScope).Start(ctx, "transaction",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(semconv.DBSystemNamePostgreSQL))
	return span
}

// fail marks the transaction's span failed with err.
func (p *Pipeline) fail(err error) {
	if p.span != nil {
		p.span.RecordError(err)
		p.span.SetStatus(codes.Error, err.Error())
	}
}

// PipelineOption tunes a pipelined transaction.
type PipelineOption func(*pipelineOptions)

type pipelineOptions struct {
	acquireTimeout, lockTimeout time.Duration
	// lockArg is lockTimeout's parameter, made once by WithLockTimeout
	// rather than per transaction.
	lockArg any
}

// WithAcquireTimeout bounds the wait for a free connection of the pool;
// past it BeginPipeline returns an error wrapping ErrPoolTimeout. Zero
// waits as long as ctx allows.
func WithAcquireTimeout(d time.Duration) PipelineOption {
	return func(o *pipelineOptions) { o.acquireTimeout = d }
}

// WithLockTimeout gives the transaction a lock_timeout of d, set in its
// first round trip and for this transaction alone (set_config's true, as
// SET LOCAL: it holds behind a transaction pooler and never reaches the
// next client of the backend). A statement that waits longer for a lock
// fails with an error that Translate maps to ErrLockTimeout. Zero keeps the
// session's lock_timeout (by default none).
func WithLockTimeout(d time.Duration) PipelineOption {
	var arg any = strconv.FormatInt(d.Milliseconds(), 10)
	return func(o *pipelineOptions) { o.lockTimeout, o.lockArg = d, arg }
}

// sqlLockTimeout sets the transaction's lock_timeout; the value is bound,
// in milliseconds, as PostgreSQL reads a unitless lock_timeout.
const sqlLockTimeout = `SELECT set_config('lock_timeout', $1::text, true)`

// BeginPipeline acquires a connection of pool for a pipelined transaction;
// nothing is sent yet. Errors are translated: ErrPoolTimeout (an
// ErrUnavailable) when WithAcquireTimeout's wait ends first,
// ErrUnavailable when the database cannot be reached.
func BeginPipeline(ctx context.Context, pool *pgxpool.Pool, opts ...PipelineOption) (*Pipeline, error) {
	var o pipelineOptions
	for _, opt := range opts {
		opt(&o)
	}
	span := startSpan(ctx)
	conn, err := Acquire(ctx, pool, o.acquireTimeout)
	if err != nil {
		if span != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			span.End()
		}
		return nil, err
	}
	cd := conn.Conn().PgConn().CustomData()
	p := &Pipeline{conn: conn, since: sessionStart(conn), span: span, implicit: cd[implicitKey] == true}
	p.b.QueuedQueries = p.queued[:0]
	p.args.typed = cd[typedKey] == true
	p.direct, _ = cd[directKey].(*directConn)
	if ac, ok := ctx.(*AttemptContext); ok && ac.watch(conn.Conn().PgConn().Conn()) {
		p.ac = ac
	}
	p.b.Queue(sqlBegin)
	if cd[pooledKey] == true {
		p.b.Queue(sqlSessionSettings).QueryRow(func(row pgx.Row) error {
			var discard1, discard2 any
			return row.Scan(&p.pid, &p.xactStart, &discard1, &discard2)
		})
	}
	if o.lockTimeout > 0 {
		p.b.Queue(sqlLockTimeout, o.lockArg)
	}
	return p, nil
}

// Acquire takes a connection of pool, waiting at most timeout for a free
// one (zero: as long as ctx allows), so that a request behind a full pool
// is answered "unavailable" rather than kept waiting. It returns an error
// wrapping ErrPoolTimeout when the wait ran out, the translated error
// otherwise. The caller releases the connection.
//
// In an *AttemptContext, whose own timer bounds the wait, timeout is not
// used: the connection handed out moves that timer to the attempt's bound.
func Acquire(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) (*pgxpool.Conn, error) {
	if ac, ok := ctx.(*AttemptContext); ok {
		conn, err := pool.Acquire(ac)
		switch {
		case err == nil && ac.Acquired():
			return conn, nil
		case err == nil:
			conn.Release() // the attempt ended as the connection came
			err = ac.Err()
		}
		if ac.acquireExpired() {
			return nil, fmt.Errorf("acquire connection: %w", ErrPoolTimeout)
		}
		return nil, fmt.Errorf("acquire connection: %w", Translate(err))
	}
	actx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	conn, err := pool.Acquire(actx)
	if err != nil {
		if ctx.Err() == nil && actx.Err() != nil {
			return nil, fmt.Errorf("acquire connection within %s: %w", timeout, ErrPoolTimeout)
		}
		return nil, fmt.Errorf("acquire connection: %w", Translate(err))
	}
	return conn, nil
}

// Batch is where the next statements are queued; Send, Commit or a
// statement run directly (Exec, Query, QueryRow) sends them.
func (p *Pipeline) Batch() *pgx.Batch { return &p.b }

// Send sends the statements queued so far (with BEGIN before them, the
// first time) in one round trip and waits for their results. On failure it
// rolls the transaction back and returns the translated error: no COMMIT was
// sent, so nothing was committed.
func (p *Pipeline) Send(ctx context.Context) error {
	if err := p.send(ctx, false); err != nil {
		p.Rollback(ctx)
		err = Translate(err)
		p.fail(err)
		return err
	}
	return nil
}

// send sends the statements queued so far in one round trip: through
// pgx.Batch, or with direct through the connection's directConn
// (decision 0106).
func (p *Pipeline) send(ctx context.Context, direct bool) error {
	if p.b.Len() == 0 {
		return nil
	}
	ctx, err := p.pgx(ctx)
	if err != nil {
		return err
	}
	p.sent = true
	if !direct {
		b := p.b // pgx's results keep the batch they read
		p.b = pgx.Batch{}
		return p.conn.SendBatch(ctx, &b).Close()
	}
	err = p.direct.sendDirect(ctx, p.conn.Conn(), &p.b)
	p.b = pgx.Batch{}
	if stalePlan(err) {
		// pgx forgets such a statement in its own cache; this one's
		// descriptions go with the connection, and the next gets fresh
		// ones.
		p.discard = true
	}
	return err
}

// stalePlan reports whether err is PostgreSQL's "cached plan must not
// change result type": a prepared statement whose result columns changed
// since it was described (a table's columns changed under SELECT *).
func stalePlan(err error) bool {
	if err == nil {
		return false // before errors.As, whose target would be made for every commit
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == pgerrcode.FeatureNotSupported
}

// pgx returns the context to hand pgx for ctx: for the attempt's own, its
// values without its end, which the connection's deadline covers
// (AttemptContext.watch), or, once it ended, its error — not a PgError,
// so that Commit takes the outcome for unknown, as when pgx finds a
// context done before a round trip.
func (p *Pipeline) pgx(ctx context.Context) (context.Context, error) {
	if p.ac == nil || ctx != context.Context(p.ac) {
		return ctx, nil
	}
	if err := p.ac.Err(); err != nil {
		return nil, fmt.Errorf("the attempt ended before the round trip: %w", err)
	}
	return p.ac.detached(), nil
}

// Exec runs sql inside the transaction at once, after the statements queued
// so far. A failure leaves the transaction for the caller to roll back.
func (p *Pipeline) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := p.send(ctx, false); err != nil {
		return pgconn.CommandTag{}, err
	}
	ctx, err := p.pgx(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return p.conn.Exec(ctx, sql, args...)
}

// Query is Exec for a statement that returns rows.
func (p *Pipeline) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.send(ctx, false); err != nil {
		return nil, err
	}
	ctx, err := p.pgx(ctx)
	if err != nil {
		return nil, err
	}
	return p.conn.Query(ctx, sql, args...)
}

// QueryRow runs sql, a statement that returns one row, inside the
// transaction in the same round trip as the statements queued so far (BEGIN
// and the lock timeout, the first time): the row's Scan queues it after
// them and sends them all. Scan returns pgx.ErrNoRows for no row, the
// statement's or an earlier statement's error otherwise; a failure leaves
// the transaction for the caller to roll back.
func (p *Pipeline) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &queuedRow{p: p, ctx: ctx, sql: sql, args: args}
}

// queuedRow is a QueryRow whose statement travels with the queued ones.
type queuedRow struct {
	p    *Pipeline
	ctx  context.Context
	sql  string
	args []any
}

func (r *queuedRow) Scan(dest ...any) error {
	r.p.b.Queue(r.sql, r.args...).QueryRow(func(row pgx.Row) error { return row.Scan(dest...) })
	return r.p.send(r.ctx, false)
}

// Commit sends the statements still queued and COMMIT in one round trip. It
// returns nil when the transaction committed. When the server refused a
// statement (the transaction was aborted, COMMIT did not run) it rolls back
// and returns the translated error. When the connection failed, or the
// server ended the session, during that round trip — so COMMIT may or may
// not have happened — it closes the connection and returns an
// *OutcomeUnknownError.
//
// A transaction that sends every statement here, in its only round trip,
// on a session whose default isolation is READ COMMITTED goes without
// BEGIN and COMMIT: the protocol's one Sync at the end of the trip makes
// its statements one implicit transaction, committed at the Sync, or
// rolled back whole when one fails — what BEGIN … COMMIT did, with two
// statements fewer for pgx and PostgreSQL to run (issue 29).
func (p *Pipeline) Commit(ctx context.Context) error {
	var tag pgconn.CommandTag
	implicit := p.implicit && !p.sent
	var err error
	if implicit {
		// BEGIN is the first statement queued (BeginPipeline).
		p.b.QueuedQueries = p.b.QueuedQueries[1:]
		tag = pgconn.NewCommandTag(sqlCommit)
		err = p.send(ctx, p.direct != nil && p.direct.takes(&p.b))
	} else {
		p.b.Queue(sqlCommit).Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
		err = p.send(ctx, false)
	}
	if err == nil {
		if tag.String() != sqlCommit {
			// COMMIT of an aborted transaction answers ROLLBACK.
			err = fmt.Errorf("commit (%s): %w", tag, pgx.ErrTxCommitRollback)
			p.fail(err)
			return err
		}
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !sessionEnded(pgErr) {
		if !implicit {
			// An implicit transaction ended at the Sync.
			p.Rollback(ctx)
		}
		err = Translate(err)
		p.fail(err)
		return err
	}
	lost := &OutcomeUnknownError{PID: p.pid, SessionStart: p.since, XactStart: p.xactStart, Err: Translate(err)}
	if p.conn.Conn().PgConn().CustomData()[pooledKey] != true {
		lost.PID, lost.XactStart = p.conn.Conn().PgConn().PID(), time.Time{}
	}
	p.fail(lost)
	p.close(ctx)
	return lost
}

// Rollback ends the transaction on a context that survives the caller's
// cancellation; when the ROLLBACK fails the connection is closed, which
// PostgreSQL treats as a rollback.
func (p *Pipeline) Rollback(ctx context.Context) {
	if p.released {
		return
	}
	if p.span != nil {
		p.span.AddEvent("rollback")
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := p.conn.Exec(rctx, sqlRollback); err != nil {
		_ = p.conn.Conn().Close(rctx)
	}
}

// close closes the broken connection and gives it back, so the pool drops
// it and its slot is free for the recheck.
func (p *Pipeline) close(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = p.conn.Conn().Close(rctx)
	p.Release()
}

// Release gives the connection back to the pool and ends the
// transaction's span; calling it again does nothing.
func (p *Pipeline) Release() {
	if !p.released {
		p.released = true
		if cut := p.ac != nil && p.ac.unwatch(); cut || p.discard {
			// The attempt's end set a past deadline on the connection,
			// or its descriptions are stale: it goes, rather than to
			// the next caller.
			ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
			_ = p.conn.Conn().Close(ctx)
			cancel()
		}
		p.conn.Release()
		if p.span != nil {
			p.span.End()
		}
	}
}

// Flag is a transaction-local boolean setting by which one statement of a
// pipelined transaction decides whether later ones write: that statement
// sets it (set_config(flag, 'on' or 'off', true)), and every statement it
// guards ends in WHERE current_setting($n)::boolean with the flag bound as
// parameter $n. The server decides mid-pipeline, so a transaction whose
// statements depend on an earlier one's outcome is still one round trip.
// A flag crosses packages as a value, never as SQL text: each guarded
// statement is whole in the package that owns its table.
type Flag string

// OutcomeUnknownError says the connection failed (or the server ended the
// session) during the round trip that carried COMMIT: whether the
// transaction committed is unknown. Recheck establishes it. Err is the
// translated cause, so errors.Is(err, ErrUnavailable) holds for a connection
// failure.
type OutcomeUnknownError struct {
	// PID is the server process of the session, and SessionStart a time
	// at or after that session began, read from the database's clock
	// (compared with pg_stat_activity.backend_start, never with the
	// host's). Behind a pooler PID is 0 when the
	// backend is unknown: the reply that would have named it was lost
	// (the one-round-trip create).
	PID          uint32
	SessionStart time.Time
	// XactStart is the transaction's start when the connection went
	// through a pooler, zero otherwise: the pooler hands the backend to
	// other clients once the transaction is over, so only a backend still
	// in this transaction is ended.
	XactStart time.Time
	Err       error
}

func (e *OutcomeUnknownError) Error() string {
	return "commit reply lost; the outcome is unknown: " + e.Err.Error()
}

func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// Recheck delays.
const (
	recheckFirstDelay = 20 * time.Millisecond
	recheckMaxDelay   = 500 * time.Millisecond
)

// Recheck is the generic half of finding out whether the transaction of lost
// committed. First the old session must be gone — until it is, statements
// still on their way to it could take locks and commit — so Recheck ends it
// (pg_terminate_backend on its pid, only if that session started before
// lost.SessionStart — or, behind a pooler, only while that backend is still
// in the transaction that started at lost.XactStart; not at all when
// lost.PID is 0) and waits for it to disappear. Then it calls check,
// which reads what the transaction would have written and reports whether it
// could tell. Both are retried with backoff until check tells or ctx ends;
// Recheck returns nil once check told, ctx's error otherwise.
func Recheck(ctx context.Context, pool *pgxpool.Pool, lost *OutcomeUnknownError, check func(ctx context.Context) bool) error {
	// Behind a pooler with the backend unknown there is nothing to end:
	// the pooler ends a backend whose client vanished mid-transaction, and
	// check's try of the key's lock waits for one still in it.
	gone := lost.PID == 0
	for delay := recheckFirstDelay; ; delay = min(delay*2, recheckMaxDelay) {
		if !gone {
			sql, since := sqlEndSession, lost.SessionStart
			if !lost.XactStart.IsZero() {
				sql, since = sqlEndTransaction, lost.XactStart
			}
			if err := pool.QueryRow(ctx, sql, int64(lost.PID), since).Scan(&gone); err != nil {
				gone = false
			}
		}
		if gone && check(ctx) {
			return nil
		}
		if !wait.For(ctx, delay) {
			return ctx.Err()
		}
	}
}

// sqlEndSession terminates the session with pid if it started before $2 (so
// that a reused pid is left alone), waiting up to a second, and reports
// whether no such session is left.
const sqlEndSession = `SELECT CASE
	WHEN EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start <= $2)
	THEN pg_terminate_backend($1::int, 1000) AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start <= $2)
	ELSE true END`

// sqlEndTransaction is sqlEndSession behind a pooler: it terminates the
// backend with pid only while it is still in the transaction that started
// at $2, and reports whether no such transaction is left. A backend the
// pooler has given to another client is left alone.
const sqlEndTransaction = `SELECT CASE
	WHEN EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND xact_start = $2)
	THEN pg_terminate_backend($1::int, 1000) AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND xact_start = $2)
	ELSE true END`
