package notes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/outbox"
)

// Actions and their parameter versions. A version changes whenever the
// meaning of a parameter or a default changes, so that an old key never
// silently matches a new meaning.
const (
	createVersion = 1
	deleteVersion = 1
)

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
	// recheckTimeout bounds how long a lost COMMIT reply is investigated.
	recheckTimeout = 5 * time.Second
)

// Config tunes the service.
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
	// that waits longer for a lock fails with *UnavailableError wrapping
	// db.ErrLockTimeout, nothing committed. Default 3s.
	LockTimeout time.Duration
	// AcquireTimeout bounds the wait of a write or a read for a free pool
	// connection; past it the request fails with *UnavailableError
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

// Observer receives the service's counts; see internal/metrics.
type Observer interface {
	// Idempotency counts one write request by action and outcome:
	// executed, replayed, key_reused, in_progress or expired.
	Idempotency(action, outcome string)
	// BusinessEffect counts one committed business effect of action.
	BusinessEffect(action string)
}

type nopObserver struct{}

func (nopObserver) Idempotency(string, string) {}
func (nopObserver) BusinessEffect(string)      {}

// Hooks let tests act inside a write's transaction. Nil hooks cost nothing.
type Hooks struct {
	// AfterEffect runs after the business effect is written and before the
	// operation record and events are; an error rolls everything back.
	AfterEffect func(ctx context.Context, tx idempotency.Querier, noteID uuid.UUID) error
}

// Service performs note writes as idempotent operations and answers reads.
type Service struct {
	pool     *pgxpool.Pool
	cfg      Config
	log      zerolog.Logger
	now      func() time.Time
	obs      Observer
	flights  *idempotency.Flights
	hooks    Hooks
	notifier *outbox.Notifier
	cache    *idempotency.Cache
	// replays counts answered replays per operation until a flush writes
	// them to operations.replays (see RunReplayCounter).
	replays *replayCounter
	// fair shares the pool's connections among tenants by turns when they
	// are contended (db.Fair): a tenant flooding within its concurrency
	// limit does not hold the pool against the others.
	fair *db.Fair
	// ids holds the database's id secret once read (ids.go).
	ids idSecret
}

// Option configures a Service.
type Option func(*Service)

// WithClock sets the clock (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// WithObserver sets where counts go (default: nowhere).
func WithObserver(o Observer) Option { return func(s *Service) { s.obs = o } }

// WithNotifier sets who wakes the relays after a commit that wrote events.
func WithNotifier(n *outbox.Notifier) Option { return func(s *Service) { s.notifier = n } }

// WithHooks installs test hooks.
func WithHooks(h Hooks) Option { return func(s *Service) { s.hooks = h } }

// Retentions returns the response and key retentions the service runs
// with (QUILL_IDEMPOTENCY_RETENTION, QUILL_KEY_RETENTION), defaults applied.
func (s *Service) Retentions() (response, key time.Duration) {
	return s.cfg.ResponseRetention, s.cfg.KeyRetention
}

// NewService returns a service over pool. It returns an error when cfg,
// after defaults, is invalid.
func NewService(pool *pgxpool.Pool, cfg Config, log zerolog.Logger, opts ...Option) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("notes config: %w", err)
	}
	s := &Service{pool: pool, cfg: cfg, log: log, now: time.Now, obs: nopObserver{}, flights: idempotency.NewFlights(),
		cache: idempotency.NewCache(cfg.ReplayCacheBytes), replays: newReplayCounter(),
		fair: db.NewFair(int(pool.Config().MaxConns))}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Request identifies one write request: the authenticated tenant, the
// operation key and how long it may wait for a concurrent request with the
// same key (negative: the configured default; capped at the default).
type Request struct {
	Tenant string
	Key    string
	Wait   time.Duration
	// Traceparent and Tracestate are the W3C trace context of the
	// request's span, carried into the outbox event as the parent of its
	// publish; empty when there is none.
	Traceparent string
	Tracestate  string
	// Render renders the response recorded for the operation when this
	// request executes it; required.
	Render Render
}

// RecordedResponse is the response recorded for an operation and replayed,
// byte for byte, to every later request with its key. The service stores it
// as it gets it from the request's Render and gives it no meaning of its own.
type RecordedResponse struct {
	Status   int
	Body     []byte
	Location string
}

// Result is what an executed write produced, for Render to turn into the
// recorded Response.
type Result struct {
	// Resource is the path of the note the write created or acted on,
	// e.g. /v1/notes/{id}.
	Resource string
	// Note is the created note (a create).
	Note *NoteView
	// Deleted is the deleted note (a delete).
	Deleted *DeleteResult
	// Err is the domain error the operation is recorded with:
	// ErrNothingToDelete for a delete that found no live note. Note and
	// Deleted are nil then.
	Err error
}

// Render turns an executed write's result into the response recorded for
// the operation. It runs inside the write, before the commit, so that the
// recorded bytes are written in the same round trip as the effect; an error
// aborts the write (nothing is committed).
type Render func(Result) (RecordedResponse, error)

// Outcome is a write's answer: the recorded response, and whether it is a
// replay of an earlier execution.
type Outcome struct {
	RecordedResponse
	Replayed bool
}

func (s *Service) waitFor(r Request) time.Duration {
	if r.Wait < 0 || r.Wait > s.cfg.Wait {
		return s.cfg.Wait
	}
	return r.Wait
}

// now returns the service clock truncated to what PostgreSQL stores, so that
// a recorded body and a later read agree.
func (s *Service) clock() time.Time { return s.now().UTC().Truncate(time.Microsecond) }

// errNoRender: a write request came without its Render.
var errNoRender = errors.New("notes: the write request has no Render")

// Create creates a note as the operation (r.Tenant, r.Key); the note's id
// is derived from the operation (ids.go). Errors: *KeyReusedError,
// *ExpiredError, ErrInProgress, *UnavailableError, ErrKeyGenerations (the
// key made maxGenerations notes already), and others for unexpected
// failures (nothing committed).
func (s *Service) Create(ctx context.Context, r Request, p CreateParams) (Outcome, error) {
	if r.Render == nil {
		return Outcome{}, errNoRender
	}
	params := idempotency.Params{"title": p.Title, "body": p.Body, "attachment": nil}
	if a := p.Attachment; a != nil {
		params["attachment"] = map[string]any{"filename": a.Filename, "content_type": a.ContentType,
			"size": len(a.Data), "sha256": a.SHA256}
	}
	fp, err := idempotency.NewFingerprint(contract.ActionCreateNote, createVersion, params)
	if err != nil {
		return Outcome{}, err
	}
	secret, err := s.ids.get(ctx, s.pool)
	if err != nil {
		return Outcome{}, s.unavailable(err, false)
	}
	// The note id is derived from the operation (ids.go); a key used for a
	// new intent after it was forgotten finds its earlier notes' ids taken,
	// and each refusal (nothing committed) moves it to the next generation.
	for gen := 0; ; gen++ {
		out, err := s.run(ctx, r, fp, func(now time.Time) (*plan, error) { return s.planCreate(r, p, secret, gen, now) })
		if !noteIDTaken(err) {
			return out, err
		}
		if gen+1 >= maxGenerations {
			return Outcome{}, fmt.Errorf("create note: %w", ErrKeyGenerations)
		}
	}
}

// noteIDTaken reports whether err is a unique constraint refusing an id
// derived from the note's: a note of an earlier generation of the key has
// it. In one statement (ClaimWrite) whichever of the note's, its
// attachment's or its event's constraints is checked first refuses it.
func noteIDTaken(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.UniqueViolation {
		return false
	}
	switch pgErr.ConstraintName {
	case "notes_pkey", "attachments_pkey", "attachments_note_id_key", outbox.EventIDConstraint:
		return true
	}
	return false
}

// Delete deletes note id as the operation (r.Tenant, r.Key). Deleting a note
// that does not exist (or not any more) is recorded with ErrNothingToDelete.
// Errors as for Create.
func (s *Service) Delete(ctx context.Context, r Request, id uuid.UUID) (Outcome, error) {
	if r.Render == nil {
		return Outcome{}, errNoRender
	}
	fp, err := idempotency.NewFingerprint(contract.ActionDeleteNote, deleteVersion, idempotency.Params{"id": id.String()})
	if err != nil {
		return Outcome{}, err
	}
	return s.run(ctx, r, fp, func(now time.Time) (*plan, error) { return s.planDelete(r, id, now), nil })
}

// effect is what an executed write produced, to be recorded.
type effect struct {
	resp     RecordedResponse
	resource string
	// counted: whether a business effect happened (a 404 delete has none).
	counted bool
	noteID  uuid.UUID
}

// plan is how one write executes. An effect known in advance (a create) is
// queued whole, guarded by the claim, so that claim, effect, record and
// COMMIT travel in one round trip; an effect that depends on what the
// database holds (a delete) runs once the claim is known.
type plan struct {
	// eff: the effect, known before the transaction when write is set.
	eff *effect
	// write: the effect as rows of one statement that also claims the
	// operation and writes its record (idempotency.ClaimWrite), args one
	// list per insert; the guarded attempt queues the same rows as
	// statements of their own. Nil for a write with no such form.
	write     *idempotency.ClaimWrite
	writeArgs [][]any
	// run: executes the effect inside the claimed transaction, queueing
	// what it can into tx's batch.
	run func(ctx context.Context, tx *db.Pipeline) (*effect, error)
}

// planFunc prepares a write at time now.
type planFunc func(now time.Time) (*plan, error)

// The test hook runs its statements on the write's pipeline.
var _ idempotency.Querier = (*db.Pipeline)(nil)

// errBusy: another transaction holds the operation's lock.
var errBusy = errors.New("operation locked by another transaction")

// run is the idempotency protocol around one write: coalesce with
// concurrent requests of this process, claim the operation's lock, replay or
// refuse a recorded operation, otherwise execute and record in one
// transaction.
func (s *Service) run(ctx context.Context, r Request, fp idempotency.Fingerprint, exec planFunc) (Outcome, error) {
	if rec := s.cache.Get(r.Tenant, r.Key); rec != nil {
		if out, err, done := s.answerRecorded(rec, fp); done {
			return out, err
		}
	}
	lockID := idempotency.LockID(r.Tenant, r.Key)
	deadline := time.Now().Add(s.waitFor(r))
	backoff := 5 * time.Millisecond
	for {
		wait, leave := s.flights.Join(lockID, fp.Action)
		if wait != nil {
			if !sleepUntil(ctx, wait, deadline) {
				return s.finalCheck(ctx, r, fp)
			}
			out, done, err := s.checkRecorded(ctx, r, fp)
			if done {
				return out, err
			}
			continue
		}
		out, err := func() (Outcome, error) {
			defer leave()
			return s.attempt(ctx, r, fp, exec)
		}()
		if !errors.Is(err, errBusy) {
			return out, err
		}
		// Another process (or a lookup) holds the lock: poll with jitter.
		sleep := min(backoff, time.Until(deadline))
		if sleep <= 0 {
			return s.finalCheck(ctx, r, fp)
		}
		backoff = min(backoff*2, 100*time.Millisecond)
		t := time.NewTimer(sleep/2 + rand.N(sleep/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return Outcome{}, ctx.Err()
		case <-t.C:
		}
		out, done, err := s.checkRecorded(ctx, r, fp)
		if done {
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
func (s *Service) finalCheck(ctx context.Context, r Request, fp idempotency.Fingerprint) (Outcome, error) {
	if ctx.Err() != nil {
		return Outcome{}, ctx.Err()
	}
	out, done, err := s.checkRecorded(ctx, r, fp)
	if done {
		return out, err
	}
	s.obs.Idempotency(fp.Action, contract.OutcomeInProgress)
	return Outcome{}, ErrInProgress
}

// checkRecorded reads the record without locking; done is false when there
// is none (or only a forgotten one) and the caller should try to execute.
func (s *Service) checkRecorded(ctx context.Context, r Request, fp idempotency.Fingerprint) (Outcome, bool, error) {
	conn, err := s.acquire(ctx, r.Tenant)
	if err != nil {
		return Outcome{}, true, s.unavailable(err, false)
	}
	rec, err := idempotency.RecordGet(ctx, conn, r.Tenant, r.Key)
	conn.Release()
	if err != nil {
		return Outcome{}, true, s.unavailable(err, false)
	}
	if rec == nil {
		return Outcome{}, false, nil
	}
	s.cache.Put(rec)
	out, err, done := s.answerRecorded(rec, fp)
	return out, done, err
}

// answerRecorded turns a committed record into the answer for fp; done is
// false for a forgotten record.
func (s *Service) answerRecorded(rec *idempotency.Record, fp idempotency.Fingerprint) (Outcome, error, bool) {
	verdict, fields := idempotency.Decide(rec, fp, s.clock())
	switch verdict {
	case idempotency.Replay:
		s.obs.Idempotency(fp.Action, contract.OutcomeReplayed)
		s.replays.add(rec.Tenant, rec.Key, rec.CreatedAt)
		return Outcome{RecordedResponse: recorded(rec), Replayed: true}, nil, true
	case idempotency.Reused:
		s.obs.Idempotency(fp.Action, contract.OutcomeKeyReused)
		return Outcome{}, &KeyReusedError{RecordedAction: rec.Action, Fields: fields}, true
	case idempotency.Expired:
		s.obs.Idempotency(fp.Action, contract.OutcomeExpired)
		return Outcome{}, &ExpiredError{Resource: rec.Resource, CompletedAt: rec.CompletedAt, ExpiredAt: rec.ExpiresAt}, true
	default:
		return Outcome{}, nil, false
	}
}

// recorded returns rec's response.
func recorded(rec *idempotency.Record) RecordedResponse {
	return RecordedResponse{Status: rec.Status, Body: rec.Body, Location: rec.Location}
}

func (s *Service) unavailable(err error, unknown bool) error {
	if errors.Is(db.Translate(err), db.ErrUnavailable) || db.IsConnectionError(err) {
		return &UnavailableError{Unknown: unknown, Err: err}
	}
	return err
}

// attempt runs one execution attempt in its own transaction, detached from
// the client's cancellation. It returns errBusy when another transaction owns
// the key.
//
// In the common case — a create with a new key — it is one round trip of
// one statement: BEGIN, the claim that writes the note, its event and the
// record only when it claimed (plan.write), COMMIT. A key whose record is
// forgotten takes a second attempt, the guarded one (attemptOnce's guarded), which
// replaces the record.
func (s *Service) attempt(reqCtx context.Context, r Request, fp idempotency.Fingerprint, planFn planFunc) (Outcome, error) {
	out, err := s.attemptOnce(reqCtx, r, fp, planFn, false)
	if errors.Is(err, errForgotten) {
		return s.attemptOnce(reqCtx, r, fp, planFn, true)
	}
	return out, err
}

// errForgotten says the one-statement claim found the key's record
// forgotten: the key is free, through the guarded claim.
var errForgotten = errors.New("the key's record is forgotten")

// attemptOnce is one attempt, guarded or (when the plan has one, no hook is
// installed and guarded is false) in one statement.
//
// The guarded attempt: BEGIN, the claim, the guarded effect, the guarded
// record, COMMIT. When the claim fails the guarded statements write nothing
// and the COMMIT commits nothing; the claim's row says why (a record to
// replay, or a lock held).
func (s *Service) attemptOnce(reqCtx context.Context, r Request, fp idempotency.Fingerprint, planFn planFunc, guarded bool) (Outcome, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), s.cfg.WriteTimeout)
	defer cancel()
	now := s.clock()
	p, err := planFn(now)
	if err != nil {
		return Outcome{}, err
	}
	turn, err := s.turn(ctx, r.Tenant)
	if err != nil {
		return Outcome{}, s.unavailable(err, false)
	}
	defer turn()
	tx, err := db.BeginPipeline(ctx, s.pool, db.WithAcquireTimeout(s.cfg.AcquireTimeout), db.WithLockTimeout(s.cfg.LockTimeout))
	if err != nil {
		return Outcome{}, s.unavailable(err, false)
	}
	defer tx.Release()

	var claim idempotency.Claim
	eff := p.eff
	if p.write != nil && s.hooks.AfterEffect == nil && !guarded {
		record := s.record(r, fp, eff, now)
		if err := p.write.Queue(tx.Batch(), record, &claim, p.writeArgs...); err != nil {
			return Outcome{}, err
		}
		return s.commit(ctx, reqCtx, tx, r, fp, &claim, record, eff)
	}
	idempotency.QueueClaimGuarded(tx.Batch(), r.Tenant, r.Key, now, &claim)
	if p.write != nil {
		if err := p.write.QueueEffectsGuarded(tx.Batch(), p.writeArgs...); err != nil {
			return Outcome{}, err
		}
	}
	if p.run != nil || s.hooks.AfterEffect != nil {
		// The effect must be decided (delete) or observed (test hook)
		// before the record is written: this round trip ends here.
		if err := tx.Send(ctx); err != nil {
			return Outcome{}, s.unavailable(err, false)
		}
		if !claim.Claimed {
			// End the transaction before answering: until then it holds
			// the key's lock, and a lookup would see "in progress".
			tx.Rollback(ctx)
			return s.unclaimed(claim, fp)
		}
		if p.run != nil {
			if eff, err = p.run(ctx, tx); err != nil {
				tx.Rollback(ctx)
				return Outcome{}, s.unavailable(err, false)
			}
		}
		if s.hooks.AfterEffect != nil {
			if err := tx.Send(ctx); err != nil {
				return Outcome{}, s.unavailable(err, false)
			}
			if err := s.hooks.AfterEffect(ctx, tx, eff.noteID); err != nil {
				tx.Rollback(ctx)
				return Outcome{}, err
			}
		}
	}
	record := s.record(r, fp, eff, now)
	idempotency.QueueInsertGuarded(tx.Batch(), record)
	return s.commit(ctx, reqCtx, tx, r, fp, &claim, record, eff)
}

// record is the operation record of eff, an execution that started at now
// and completes now.
func (s *Service) record(r Request, fp idempotency.Fingerprint, eff *effect, now time.Time) *idempotency.Record {
	completed := s.clock()
	return &idempotency.Record{
		Tenant: r.Tenant, Key: r.Key, Action: fp.Action, Version: fp.Version,
		Fingerprint: fp.Sum, Fields: fp.Fields, Resource: eff.resource,
		Status: eff.resp.Status, Body: eff.resp.Body, Location: eff.resp.Location,
		CreatedAt: now, CompletedAt: completed,
		ExpiresAt: completed.Add(s.cfg.ResponseRetention), ForgetAt: completed.Add(s.cfg.KeyRetention),
	}
}

// commit sends what tx still holds with COMMIT and answers from the
// outcome: executed, the claim's answer when it did not claim (the COMMIT
// then committed nothing), or the recheck's when the COMMIT's reply was
// lost. A claim that did not claim because the record is forgotten (the
// one-statement claim) returns errForgotten.
func (s *Service) commit(ctx, reqCtx context.Context, tx *db.Pipeline, r Request, fp idempotency.Fingerprint, claim *idempotency.Claim, record *idempotency.Record, eff *effect) (Outcome, error) {
	err := tx.Commit(ctx)
	var lost *db.OutcomeUnknownError
	switch {
	case err == nil && claim.Forgotten(record.CreatedAt):
		return Outcome{}, errForgotten
	case err == nil && !claim.Claimed:
		return s.unclaimed(*claim, fp) // the COMMIT committed nothing
	case err == nil:
		s.committed(fp, eff)
		s.cache.Put(record)
		return Outcome{RecordedResponse: eff.resp}, nil
	case errors.As(err, &lost):
		// The COMMIT may or may not have happened: find out on another
		// connection (Commit gave this one back, closed).
		return s.recheck(reqCtx, r, fp, record, eff, lost)
	case errors.Is(err, db.ErrDuplicate) && !noteIDTaken(err):
		return Outcome{}, errBusy // a concurrent writer recorded the key first
	default:
		return Outcome{}, fmt.Errorf("write %s: %w", fp.Action, err)
	}
}

// unclaimed answers an attempt whose claim failed: the recorded outcome, or
// errBusy when another transaction holds the key.
func (s *Service) unclaimed(c idempotency.Claim, fp idempotency.Fingerprint) (Outcome, error) {
	if c.Record != nil {
		s.cache.Put(c.Record)
		if out, err, done := s.answerRecorded(c.Record, fp); done {
			return out, err
		}
	}
	return Outcome{}, errBusy
}

// committed counts an executed operation and wakes the relays when it wrote
// events (every counted effect does).
func (s *Service) committed(fp idempotency.Fingerprint, eff *effect) {
	s.obs.Idempotency(fp.Action, contract.OutcomeExecuted)
	if eff.counted {
		s.obs.BusinessEffect(fp.Action)
		s.notifier.Signal()
	}
}

// recheck establishes whether a write whose COMMIT reply was lost
// committed. Once db.Recheck ended the old session, it takes the key's lock
// and reads the record: found means committed; absent means nothing was.
func (s *Service) recheck(reqCtx context.Context, r Request, fp idempotency.Fingerprint, mine *idempotency.Record, eff *effect, lost *db.OutcomeUnknownError) (Outcome, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), recheckTimeout)
	defer cancel()
	s.log.Warn().Err(lost.Err).Str("action", fp.Action).Str("key_hash", opkey.Hash(r.Tenant, r.Key)).
		Str("error_category", "commit_reply_lost").Msg("commit reply lost; re-checking the outcome")
	var (
		out    Outcome
		outErr error
	)
	err := db.Recheck(ctx, s.pool, lost, func(ctx context.Context) bool {
		var locked bool
		var rec *idempotency.Record
		err := db.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			idempotency.QueueClaim(b, r.Tenant, r.Key, &locked, &rec)
			return tx.SendBatch(ctx, b).Close()
		})
		switch {
		case err != nil:
			return false
		case rec != nil && rec.Resource == mine.Resource && rec.CreatedAt.Equal(mine.CreatedAt):
			s.committed(fp, eff)
			s.cache.Put(rec)
			out = Outcome{RecordedResponse: recorded(rec)}
		case rec != nil:
			var done bool
			if out, outErr, done = s.answerRecorded(rec, fp); !done {
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
		return Outcome{}, &UnavailableError{Unknown: true, Err: lost.Err}
	}
	return out, outErr
}

// The rows a create writes, as notes owns them (see db.Insert).
var (
	noteInsert = db.Insert{Table: "notes", Columns: []db.Column{
		{Name: "id", Type: "uuid"}, {Name: "tenant", Type: "text"}, {Name: "title", Type: "text"},
		{Name: "body", Type: "text"}, {Name: "created_at", Type: "timestamptz"},
	}}
	attachmentInsert = db.Insert{Table: "attachments", Columns: []db.Column{
		{Name: "id", Type: "uuid"}, {Name: "tenant", Type: "text"}, {Name: "note_id", Type: "uuid"},
		{Name: "filename", Type: "text"}, {Name: "content_type", Type: "text"}, {Name: "size", Type: "int"},
		{Name: "sha256", Type: "text"}, {Name: "data", Type: "bytea"},
	}}

	// A create in one statement: the claim, the note (and its
	// attachment), its event and the record.
	createWrite               = idempotency.NewClaimWrite(noteInsert, outbox.EventInsert)
	createWithAttachmentWrite = idempotency.NewClaimWrite(noteInsert, attachmentInsert, outbox.EventInsert)
)

const sqlNoteDelete = `UPDATE notes SET deleted_at = $3 WHERE tenant = $1 AND id = $2 AND deleted_at IS NULL`

func (s *Service) planCreate(r Request, p CreateParams, secret []byte, generation int, now time.Time) (*plan, error) {
	id := NoteID(secret, r.Tenant, r.Key, generation)
	n := Note{ID: id, Tenant: r.Tenant, Title: p.Title, Body: p.Body, CreatedAt: now}
	var aid uuid.UUID
	if a := p.Attachment; a != nil {
		aid = AttachmentID(id)
		n.Attachment = &Attachment{ID: aid, NoteID: id, Filename: a.Filename, ContentType: a.ContentType,
			Size: len(a.Data), SHA256: a.SHA256, Status: AttachmentPending}
	}
	view := n.View()
	resource := contract.NotePath(id.String())
	resp, err := r.Render(Result{Resource: resource, Note: &view})
	if err != nil {
		return nil, fmt.Errorf("render create: %w", err)
	}
	eff := &effect{resp: resp, resource: resource, counted: true, noteID: id}
	noteArgs := []any{pgUUID(n.ID), n.Tenant, n.Title, n.Body, n.CreatedAt}
	var attArgs []any
	if a := p.Attachment; a != nil {
		attArgs = []any{pgUUID(aid), r.Tenant, pgUUID(id), a.Filename, a.ContentType, len(a.Data), a.SHA256, a.Data}
	}
	event, err := outbox.InsertArgs(s.event(r, contract.EventNoteCreated, id, now, view))
	if err != nil {
		return nil, err
	}
	if attArgs != nil {
		return &plan{eff: eff, write: createWithAttachmentWrite, writeArgs: [][]any{noteArgs, attArgs, event}}, nil
	}
	return &plan{eff: eff, write: createWrite, writeArgs: [][]any{noteArgs, event}}, nil
}

// DeleteResult is what a successful delete did.
type DeleteResult struct {
	ID        string `json:"id"`
	DeletedAt string `json:"deleted_at"`
}

func (s *Service) planDelete(r Request, id uuid.UUID, now time.Time) *plan {
	return &plan{run: func(ctx context.Context, tx *db.Pipeline) (*effect, error) {
		// The UPDATE takes the note's row lock, which orders this event
		// after every other event of the note that committed before it.
		tag, err := tx.Exec(ctx, sqlNoteDelete, r.Tenant, pgUUID(id), now)
		if err != nil {
			return nil, fmt.Errorf("delete note: %w", db.Translate(err))
		}
		resource := contract.NotePath(id.String())
		if tag.RowsAffected() == 0 {
			resp, err := r.Render(Result{Resource: resource, Err: ErrNothingToDelete})
			if err != nil {
				return nil, fmt.Errorf("render delete: %w", err)
			}
			return &effect{resp: resp, resource: resource, noteID: id}, nil
		}
		res := DeleteResult{ID: id.String(), DeletedAt: FormatTime(now)}
		resp, err := r.Render(Result{Resource: resource, Deleted: &res})
		if err != nil {
			return nil, fmt.Errorf("render delete: %w", err)
		}
		if err := s.queueEvent(tx.Batch(), r, contract.EventNoteDeleted, id, now, res); err != nil {
			return nil, err
		}
		return &effect{resp: resp, resource: resource, counted: true, noteID: id}, nil
	}}
}

// pgUUID passes a UUID to pgx in binary; a uuid.UUID would go through its
// string form.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

func (s *Service) queueEvent(b *pgx.Batch, r Request, typ string, noteID uuid.UUID, now time.Time, data any) error {
	return outbox.QueueGuarded(b, s.event(r, typ, noteID, now, data), idempotency.Claimed)
}

// event is the event of type typ that operation r writes about note noteID.
func (s *Service) event(r Request, typ string, noteID uuid.UUID, now time.Time, data any) outbox.Event {
	return outbox.Event{ID: EventID(noteID, typ), Tenant: r.Tenant, OperationKey: r.Key, AggregateID: noteID,
		Type: typ, Time: now, Data: data, Traceparent: r.Traceparent, Tracestate: r.Tracestate}
}
