package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/db"
)

// recheckTimeout bounds how long a lost COMMIT reply is investigated.
const recheckTimeout = 5 * time.Second

// Defaults of Config.
const (
	DefaultResponseRetention = 72 * time.Hour
	DefaultKeyRetention      = 720 * time.Hour
	DefaultWait              = 2 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultReplayCacheBytes  = 32 << 20
	// DefaultLockTimeout bounds a write's wait for a row lock another
	// transaction holds (a worker's batch holds its notes' rows): long
	// enough for a batch's commit, short enough that a pool connection is
	// not held for the batch's whole ack wait.
	DefaultLockTimeout = 3 * time.Second
	// DefaultAcquireTimeout bounds the wait for a free pool connection.
	DefaultAcquireTimeout = 5 * time.Second
	// DefaultReplayFlushInterval is how often the replay counts are
	// written to operations.replays.
	DefaultReplayFlushInterval = time.Second
)

// Config tunes a Protocol (and the note service, whose settings these
// are); NewProtocol takes it with WithDefaults applied.
type Config struct {
	// ResponseRetention is how long a completed operation's response is
	// replayed. Default 72h.
	ResponseRetention time.Duration
	// KeyRetention is how long a key is remembered at all (tombstone);
	// at least ResponseRetention. Default 720h.
	KeyRetention time.Duration
	// Wait is the longest a request waits for a concurrent one with the
	// same key. Default 2s.
	Wait time.Duration
	// WriteTimeout bounds one write's transaction; it runs detached from
	// the client's connection so that a disconnect never aborts a commit.
	// Default 30s.
	WriteTimeout time.Duration
	// ReplayCacheBytes bounds the in-process cache of committed records
	// that answers replays without a round trip. Default 32 MiB; negative
	// disables it.
	ReplayCacheBytes int
	// ReplayFlushInterval is how often RunReplayCounter adds the replays
	// counted in memory to operations.replays. Default 1s.
	ReplayFlushInterval time.Duration
	// LockTimeout is the lock_timeout of a write's transaction: a write
	// that waits longer for a lock fails with *idempotency.UnavailableError wrapping
	// db.ErrLockTimeout, nothing committed. Default 3s.
	LockTimeout time.Duration
	// AcquireTimeout bounds the wait of a write or a read for a free pool
	// connection; past it the request fails with *idempotency.UnavailableError
	// wrapping db.ErrPoolTimeout. Default 5s.
	AcquireTimeout time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.ResponseRetention = cmp.Or(c.ResponseRetention, DefaultResponseRetention)
	c.KeyRetention = cmp.Or(c.KeyRetention, DefaultKeyRetention)
	c.Wait = cmp.Or(c.Wait, DefaultWait)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.ReplayCacheBytes = cmp.Or(c.ReplayCacheBytes, DefaultReplayCacheBytes)
	c.ReplayFlushInterval = cmp.Or(c.ReplayFlushInterval, DefaultReplayFlushInterval)
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultLockTimeout)
	c.AcquireTimeout = cmp.Or(c.AcquireTimeout, DefaultAcquireTimeout)
	return c
}

// Validate returns an error naming the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.ResponseRetention <= 0:
		return errors.New("response retention must be positive")
	case c.KeyRetention < c.ResponseRetention:
		return fmt.Errorf("key retention (%s) must be at least the response retention (%s)", c.KeyRetention, c.ResponseRetention)
	case c.Wait < 0:
		return errors.New("wait must not be negative")
	case c.WriteTimeout <= 0:
		return errors.New("write timeout must be positive")
	case c.ReplayFlushInterval < 0:
		return errors.New("replay flush interval must not be negative")
	case c.LockTimeout < 0:
		return errors.New("lock timeout must not be negative")
	case c.AcquireTimeout < 0:
		return errors.New("acquire timeout must not be negative")
	}
	return nil
}

// Observer receives a protocol's counts.
type Observer interface {
	// Idempotency counts one write request by action and outcome:
	// executed, replayed, key_reused, in_progress or expired.
	Idempotency(action, outcome string)
	// BusinessEffect counts one committed business effect of action; it is
	// called after the COMMIT that wrote it.
	BusinessEffect(action string)
}

// Gate hands out the pool in a tenant's turn (see db.Fair): Turn before a
// transaction, Acquire for a connection. Each returns the function that
// gives the turn (and the connection) back, or an error wrapping
// db.ErrPoolTimeout when the wait ran out.
type Gate interface {
	Turn(ctx context.Context, tenant string) (release func(), err error)
	Acquire(ctx context.Context, tenant string) (q Querier, release func(), err error)
}

// Protocol runs operations under Quill's idempotency contract: coalesce
// with concurrent requests for the key, claim it, replay or refuse a
// recorded operation, otherwise execute and record it in one transaction,
// and find out the truth when a COMMIT's reply is lost. The operation's
// own rules come in its Plan.
type Protocol struct {
	pool    *pgxpool.Pool
	cfg     Config
	log     zerolog.Logger
	now     func() time.Time
	obs     Observer
	gate    Gate
	flights *Flights
	cache   *Cache
	// replays counts answered replays per operation until a flush writes
	// them to operations.replays (RunReplayCounter).
	replays *replayCounter
	// txOptions are every attempt's transaction options, made once.
	txOptions []db.PipelineOption
	// group, when set, carries the transactions of PlanOneTrip's
	// operations (UseGroup).
	group *db.Group
	// attempts bounds every attempt, by one timer.
	attempts *db.Attempts
}

// UseGroup makes the attempts of operations planned by PlanOneTrip travel
// through g, several concurrent ones in one pipelined write (decision
// 0103). Call it before the first Run.
func (p *Protocol) UseGroup(g *db.Group) { p.group = g }

// NewProtocol returns a protocol over pool; now is its clock.
func NewProtocol(pool *pgxpool.Pool, cfg Config, log zerolog.Logger, now func() time.Time, obs Observer, gate Gate) *Protocol {
	return &Protocol{pool: pool, cfg: cfg, log: log, now: now, obs: obs, gate: gate, flights: NewFlights(),
		cache: NewCache(cfg.ReplayCacheBytes), replays: newReplayCounter(),
		attempts:  db.NewAttempts(cfg.AcquireTimeout, cfg.WriteTimeout),
		txOptions: []db.PipelineOption{db.WithAcquireTimeout(cfg.AcquireTimeout), db.WithLockTimeout(cfg.LockTimeout)}}
}

// Request is one write request for an operation.
type Request struct {
	Tenant, Key string
	// Wait is how long it may wait for a concurrent request with its key
	// (negative: Config.Wait; capped at it).
	Wait        time.Duration
	Fingerprint Fingerprint
	// Plan prepares the operation for an attempt that started at now,
	// inside the attempt's transaction tx, before the claim. An operation
	// whose effect depends on what the database holds reads it here (and
	// locks it, so that it holds until the COMMIT); tx sends what is
	// queued so far only when Plan runs a statement. An error ends the
	// attempt, nothing committed.
	Plan func(ctx context.Context, tx *db.Pipeline, now time.Time) (*Plan, error)
	// PlanOneTrip, when set, is used instead of Plan: the plan of an
	// operation that reads nothing first (a create), its parameters kept
	// in args. Its transaction is one round trip, which a Group may carry
	// beside others (UseGroup).
	PlanOneTrip func(args *db.Args, now time.Time) (*Plan, error)
}

// Plan is what one attempt writes.
type Plan struct {
	// Outcome names what the operation did, in its action's words
	// ("created"); Body is what its handler rendered for it. Both are
	// recorded and replayed as they are.
	Outcome string
	Body    []byte
	// Resource is the path of what the operation created or acted on.
	Resource string
	// ResourceVersion is the version the operation left the resource at
	// (recorded, and replayed as the ETag); 0 for none.
	ResourceVersion int
	// Effect says whether the operation has a business effect (counted,
	// and reported to the Observer after the COMMIT).
	Effect bool
	// Write is the claim's statement, whose inserts write the effect's
	// rows; Args holds one parameter list per insert.
	Write *ClaimWrite
	Args  [][]any
	// Then queues the statements that follow the claim in the same round
	// trip, each guarded by Claimed (a delete's UPDATE); nil for none.
	Then func(b *pgx.Batch) error
}

// Answer is a write's answer: the recorded response, and whether it is a
// replay of an earlier execution.
type Answer struct {
	Outcome  string
	Body     []byte
	Resource string
	// ResourceVersion is the version the operation left its resource at;
	// 0 for none.
	ResourceVersion int
	Replayed        bool
}

// Executing reports whether a request of this process is executing
// (tenant, key), and for which action.
func (p *Protocol) Executing(tenant, key string) (action string, ok bool) {
	return p.flights.Executing(LockID(tenant, key))
}

// errBusy: another transaction holds the operation's lock.
var errBusy = errors.New("operation locked by another transaction")

// Run runs r: it answers from the record when the key has one, waits for
// a concurrent request with the key, or executes r's plan and records it.
// Errors: *KeyReusedError, *ExpiredError, ErrInProgress, *UnavailableError,
// the context's, and the plan's or the statement's otherwise (nothing
// committed; a unique violation of an effect's row is returned as the
// driver's *pgconn.PgError, wrapped).
func (p *Protocol) Run(ctx context.Context, r Request) (Answer, error) {
	fp := r.Fingerprint
	if rec := p.cache.Get(r.Tenant, r.Key); rec != nil {
		if out, err, done := p.answerRecorded(rec, fp); done {
			return out, err
		}
	}
	lockID := LockID(r.Tenant, r.Key)
	wait := p.cfg.Wait
	if r.Wait >= 0 && r.Wait < wait {
		wait = r.Wait
	}
	deadline := time.Now().Add(wait)
	backoff := 5 * time.Millisecond
	for {
		done, leave := p.flights.Join(lockID, fp.Action)
		if done != nil {
			if !sleepUntil(ctx, done, deadline) {
				return p.finalCheck(ctx, r)
			}
			if out, done, err := p.checkRecorded(ctx, r); done {
				return out, err
			}
			continue
		}
		out, err := func() (Answer, error) {
			defer leave()
			return p.attempt(ctx, r)
		}()
		if !errors.Is(err, errBusy) {
			return out, err
		}
		// Another process (or a lookup) holds the lock: poll with jitter.
		sleep := min(backoff, time.Until(deadline))
		if sleep <= 0 {
			return p.finalCheck(ctx, r)
		}
		backoff = min(backoff*2, 100*time.Millisecond)
		t := time.NewTimer(sleep/2 + rand.N(sleep/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return Answer{}, ctx.Err()
		case <-t.C:
		}
		if out, done, err := p.checkRecorded(ctx, r); done {
			return out, err
		}
	}
}

// sleepUntil waits for ch or the deadline; it reports whether ch closed.
func sleepUntil(ctx context.Context, ch <-chan struct{}, deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// finalCheck answers a request whose wait ran out: the recorded outcome if
// it appeared meanwhile, else ErrInProgress.
func (p *Protocol) finalCheck(ctx context.Context, r Request) (Answer, error) {
	if ctx.Err() != nil {
		return Answer{}, ctx.Err()
	}
	if out, done, err := p.checkRecorded(ctx, r); done {
		return out, err
	}
	p.obs.Idempotency(r.Fingerprint.Action, contract.OutcomeInProgress)
	return Answer{}, ErrInProgress
}

// checkRecorded reads the record without locking; done is false when there
// is none (or only a forgotten one) and the caller should try to execute.
func (p *Protocol) checkRecorded(ctx context.Context, r Request) (Answer, bool, error) {
	q, release, err := p.gate.Acquire(ctx, r.Tenant)
	if err != nil {
		return Answer{}, true, unavailable(err, false)
	}
	rec, err := RecordGet(ctx, q, r.Tenant, r.Key)
	release()
	if err != nil {
		return Answer{}, true, unavailable(err, false)
	}
	if rec == nil {
		return Answer{}, false, nil
	}
	p.cache.Put(rec)
	out, err, done := p.answerRecorded(rec, r.Fingerprint)
	return out, done, err
}

// answerRecorded turns a committed record into the answer for fp; done is
// false for a forgotten record.
func (p *Protocol) answerRecorded(rec *Record, fp Fingerprint) (Answer, error, bool) {
	verdict, fields := Decide(rec, fp, p.clock())
	switch verdict {
	case Replay:
		p.obs.Idempotency(fp.Action, contract.OutcomeReplayed)
		p.replays.add(rec.Tenant, rec.Key, rec.CreatedAt)
		return Answer{Outcome: rec.Outcome, Body: rec.Body, Resource: rec.Resource, ResourceVersion: rec.ResourceVersion, Replayed: true}, nil, true
	case Reused:
		p.obs.Idempotency(fp.Action, contract.OutcomeKeyReused)
		return Answer{}, &KeyReusedError{RecordedAction: rec.Action, Fields: fields}, true
	case Expired:
		p.obs.Idempotency(fp.Action, contract.OutcomeExpired)
		return Answer{}, &ExpiredError{Resource: rec.Resource, CompletedAt: rec.CompletedAt, ExpiredAt: rec.ExpiresAt}, true
	default:
		return Answer{}, nil, false
	}
}

// clock is the protocol's clock truncated to what PostgreSQL stores, so
// that a recorded time and a later read agree.
func (p *Protocol) clock() time.Time { return p.now().UTC().Truncate(time.Microsecond) }

// unavailable wraps err in *UnavailableError when it says the database
// could not be used.
func unavailable(err error, unknown bool) error {
	if errors.Is(db.Translate(err), db.ErrUnavailable) || db.IsConnectionError(err) {
		return &UnavailableError{Unknown: unknown, Err: err}
	}
	return err
}

// attempt is one execution attempt, in a transaction of its own detached
// from the request's cancellation: BEGIN, what the plan reads, the claim
// statement (which, only when it claims, writes the record and the
// effect's rows, and turns Claimed on), the plan's guarded statements, and
// COMMIT — one round trip unless the plan reads. When the claim fails
// nothing is written and the COMMIT commits nothing; the claim's row says
// why (a record to answer from, or the lock held: errBusy).
func (p *Protocol) attempt(reqCtx context.Context, r Request) (Answer, error) {
	// One context, and the protocol's one timer: the pool's wait bounded
	// by the acquire timeout, then the whole attempt by the write timeout.
	ctx, cancel := p.attempts.Start(reqCtx)
	defer cancel()
	turn, err := p.gate.Turn(ctx, r.Tenant)
	if err != nil {
		return Answer{}, unavailable(err, false)
	}
	defer turn()
	if r.PlanOneTrip != nil && p.group != nil {
		return p.attemptGrouped(ctx, reqCtx, r)
	}
	tx, err := db.BeginPipeline(ctx, p.pool, p.txOptions...)
	if err != nil {
		return Answer{}, unavailable(err, false)
	}
	defer tx.Release()
	now := p.clock()
	var plan *Plan
	if r.PlanOneTrip != nil {
		plan, err = r.PlanOneTrip(tx.Args(), now)
	} else {
		plan, err = r.Plan(ctx, tx, now)
	}
	if err != nil {
		tx.Rollback(ctx)
		return Answer{}, unavailable(err, false)
	}
	rec := p.record(r, plan, now)
	var claim Claim
	if err := plan.Write.Queue(tx.Batch(), tx.Args(), rec, &claim, plan.Args...); err != nil {
		tx.Rollback(ctx)
		return Answer{}, err
	}
	if plan.Then != nil {
		if err := plan.Then(tx.Batch()); err != nil {
			tx.Rollback(ctx)
			return Answer{}, err
		}
	}
	return p.committed(reqCtx, r, plan, rec, &claim, tx.Commit(ctx))
}

// attemptGrouped is attempt for an operation planned by PlanOneTrip, whose
// transaction — the claim, its effect and what follows it, one round trip
// — the group carries, in a write it may share with other operations'.
// ctx is the attempt's, whose acquire bound ends the wait for the group:
// a transaction still queued when it ends is not sent.
func (p *Protocol) attemptGrouped(ctx, reqCtx context.Context, r Request) (Answer, error) {
	args := p.group.NewArgs()
	now := p.clock()
	plan, err := r.PlanOneTrip(args, now)
	if err != nil {
		return Answer{}, unavailable(err, false)
	}
	rec := p.record(r, plan, now)
	var claim Claim
	var b pgx.Batch
	if err := plan.Write.Queue(&b, args, rec, &claim, plan.Args...); err != nil {
		return Answer{}, err
	}
	if plan.Then != nil {
		if err := plan.Then(&b); err != nil {
			return Answer{}, err
		}
	}
	tx := db.GroupTxFromBatch(&b)
	tx.LockTimeout = p.cfg.LockTimeout
	err = p.group.Do(ctx, tx)
	if errors.Is(err, db.ErrReadAfterCommit) {
		// Committed, but the claim's row was not read: what it did is
		// the record's to say, as after a lost reply.
		err = &db.OutcomeUnknownError{Err: err}
	}
	return p.committed(reqCtx, r, plan, rec, &claim, err)
}

// committed answers an attempt whose transaction's COMMIT returned err.
func (p *Protocol) committed(reqCtx context.Context, r Request, plan *Plan, rec *Record, claim *Claim, err error) (Answer, error) {
	var lost *db.OutcomeUnknownError
	switch {
	case err == nil && !claim.Claimed:
		return p.unclaimed(*claim, r.Fingerprint) // the COMMIT committed nothing
	case err == nil:
		p.executed(r.Fingerprint, plan)
		p.cache.Put(rec)
		return Answer{Outcome: plan.Outcome, Body: plan.Body, Resource: plan.Resource, ResourceVersion: plan.ResourceVersion}, nil
	case errors.As(err, &lost):
		// The COMMIT may or may not have happened: find out on another
		// connection (Commit gave this one back, closed).
		return p.recheck(reqCtx, r, plan, rec, lost)
	default:
		return Answer{}, unavailable(fmt.Errorf("write %s: %w", r.Fingerprint.Action, err), false)
	}
}

// record is the operation record of plan, an execution that started at now
// and completes now.
func (p *Protocol) record(r Request, plan *Plan, now time.Time) *Record {
	completed := p.clock()
	fp := r.Fingerprint
	return &Record{
		Tenant: r.Tenant, Key: r.Key, Action: fp.Action, Version: fp.Version,
		Fingerprint: fp.Sum, fieldsJSON: fp.fieldsJSON, Resource: plan.Resource,
		Outcome: plan.Outcome, Body: plan.Body, ResourceVersion: plan.ResourceVersion,
		CreatedAt: now, CompletedAt: completed,
		ExpiresAt: completed.Add(p.cfg.ResponseRetention), ForgetAt: completed.Add(p.cfg.KeyRetention),
	}
}

// unclaimed answers an attempt whose claim failed: the recorded outcome, or
// errBusy when another transaction holds the key (or recorded it after the
// claim's snapshot).
func (p *Protocol) unclaimed(c Claim, fp Fingerprint) (Answer, error) {
	if c.Record != nil {
		p.cache.Put(c.Record)
		if out, err, done := p.answerRecorded(c.Record, fp); done {
			return out, err
		}
	}
	return Answer{}, errBusy
}

// executed counts a committed execution and its business effect.
func (p *Protocol) executed(fp Fingerprint, plan *Plan) {
	p.obs.Idempotency(fp.Action, contract.OutcomeExecuted)
	if plan.Effect {
		p.obs.BusinessEffect(fp.Action)
	}
}

// recheck establishes whether a write whose COMMIT reply was lost
// committed. Once db.Recheck ended the old session, it takes the key's lock
// and reads the record: found means committed; absent means nothing was.
func (p *Protocol) recheck(reqCtx context.Context, r Request, plan *Plan, mine *Record, lost *db.OutcomeUnknownError) (Answer, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), recheckTimeout)
	defer cancel()
	fp := r.Fingerprint
	p.log.Warn().Err(lost.Err).Str("action", fp.Action).Str("key_hash", opkey.Hash(r.Tenant, r.Key)).
		Str("error_category", "commit_reply_lost").Msg("commit reply lost; re-checking the outcome")
	var (
		out    Answer
		outErr error
	)
	err := db.Recheck(ctx, p.pool, lost, func(ctx context.Context) bool {
		var locked bool
		var rec *Record
		err := db.WithTx(ctx, p.pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			QueueClaim(b, r.Tenant, r.Key, &locked, &rec)
			return tx.SendBatch(ctx, b).Close()
		})
		switch {
		case err != nil:
			return false
		case rec != nil && rec.Resource == mine.Resource && rec.CreatedAt.Equal(mine.CreatedAt):
			p.executed(fp, plan)
			p.cache.Put(rec)
			out = Answer{Outcome: rec.Outcome, Body: rec.Body, Resource: rec.Resource, ResourceVersion: rec.ResourceVersion}
		case rec != nil:
			var done bool
			if out, outErr, done = p.answerRecorded(rec, fp); !done {
				outErr = &UnavailableError{Err: lost.Err}
			}
		case locked:
			outErr = &UnavailableError{Err: lost.Err}
		default:
			return false // someone else holds the key's lock
		}
		return true
	})
	if err != nil {
		return Answer{}, &UnavailableError{Unknown: true, Err: lost.Err}
	}
	return out, outErr
}
