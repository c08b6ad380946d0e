// Package relay publishes committed outbox events to NATS JetStream: it
// provisions the stream, claims events with session-level advisory locks on
// a connection of its own (a claim writes nothing; it ends when the relay
// lets go or its session ends), publishes each with its event id as
// Nats-Msg-Id, waits for the stream's acknowledgement and only then marks it
// published. Claiming and publishing the next batch overlap with waiting for
// and marking the previous one. It wakes on LISTEN/NOTIFY, polls as a
// fallback, backs off with jitter while NATS or PostgreSQL is down, and
// parks events that can never be published. Several relays may run at once.
// The stream's definition is package stream's; the retention cleanup that
// runs beside the relay is package retention's.
package relay

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/tracing"
	"github.com/quillhq/quill/internal/wait"
)

// The relay's timings and batch: fixed values, not settings (decision
// 0076); Config's fields of the same names let a test of this package or
// an in-process run shorten them.
const (
	// DefaultLease bounds how long a vanished relay's claims outlive it
	// (it was QUILL_RELAY_LEASE).
	DefaultLease = 30 * time.Second
	// DefaultPollInterval is the polling fallback when a notification is
	// lost (it was QUILL_RELAY_POLL_INTERVAL).
	DefaultPollInterval = time.Second
	// DefaultMaxBackoff caps the backoff while NATS or PostgreSQL fail
	// (it was QUILL_RELAY_MAX_BACKOFF).
	DefaultMaxBackoff = 30 * time.Second
	// DefaultAckTimeout bounds the wait for the stream's acknowledgement.
	DefaultAckTimeout = 10 * time.Second
	// DefaultBatch is how many events one pass claims (it was
	// QUILL_RELAY_BATCH).
	DefaultBatch  = 256
	statsInterval = 5 * time.Second
)

// Config tunes a relay. Every zero field takes its default; only Stream
// comes from settings (QUILL_STREAM and the others of package stream), the
// rest are the constants above unless a test sets them.
type Config struct {
	// Stream is the stream the relay provisions and publishes to; its
	// zero fields take stream's defaults.
	Stream stream.Config
	// Lease bounds how long the claims of a relay that vanished without
	// closing its connection (a host crash, a network partition) outlive
	// it: the claim session's TCP keepalives and tcp_user_timeout make
	// PostgreSQL end it within about Lease. A relay process that dies
	// loses its claims at once. It also bounds a claim statement and the
	// wait for a batch's acknowledgements beyond AckTimeout. Default
	// DefaultLease.
	Lease time.Duration
	// PollInterval is the longest a committed event waits when its
	// notification is lost. Default DefaultPollInterval.
	PollInterval time.Duration
	// MaxBackoff caps the jittered backoff while NATS or PostgreSQL fail.
	// Default DefaultMaxBackoff.
	MaxBackoff time.Duration
	// AckTimeout bounds the wait for the stream's acknowledgement.
	// Default DefaultAckTimeout.
	AckTimeout time.Duration
	// Batch is how many events one pass claims. Default DefaultBatch.
	Batch int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Stream = c.Stream.WithDefaults()
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.AckTimeout = cmp.Or(c.AckTimeout, DefaultAckTimeout)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	return c
}

// WorstRepublishDelay is the longest time between a relay's publish of an
// event and its republish by another relay after a crash or a hang before
// the mark: the first relay's session must end (within the lease: by
// keepalives when it vanished, by idle_session_timeout when it hung), the
// taker may be backing off, and it may sleep a poll interval.
func (c Config) WorstRepublishDelay() time.Duration {
	return c.AckTimeout + c.Lease + c.MaxBackoff + c.PollInterval
}

// Validate checks that the horizons nest: a republish after a crash falls
// inside the duplicate window (so JetStream drops it), and the duplicate
// window fits in the stream's MaxAge (stream.Config.Validate). The error
// names the settings involved and the relay's fixed timings. (That consumers remember events for as long
// as the stream keeps them is retention.Config.CoversStream's check.)
func (c Config) Validate() error {
	switch {
	case c.Batch < 1:
		return errors.New("the relay's batch must be at least 1")
	case c.WorstRepublishDelay() >= c.Stream.DuplicateWindow:
		return fmt.Errorf("QUILL_DUPLICATE_WINDOW %s must be longer than the relay's worst-case republish delay, ack timeout %s + lease %s + backoff cap %s + poll interval %s = %s, or a relay crash or hang could publish an event twice",
			c.Stream.DuplicateWindow, c.AckTimeout, c.Lease, c.MaxBackoff, c.PollInterval, c.WorstRepublishDelay())
	}
	return c.Stream.Validate()
}

// Hooks let tests act at points a crash could hit. Nil hooks cost nothing.
type Hooks struct {
	// AfterAck runs after the stream acknowledged a batch's events and
	// before they are marked; an error abandons the batch as a crash would:
	// nothing is marked and its claims end (a crash ends them with the
	// session), so a later pass publishes the events again.
	AfterAck func(acked []outbox.Published) error
}

// Relay moves events from the outbox to the stream.
type Relay struct {
	pool  *pgxpool.Pool
	nc    *nats.Conn
	js    jetstream.JetStream
	cfg   Config
	log   zerolog.Logger
	m     *metrics.Relay
	id    string
	wake  chan struct{}
	hooks Hooks
	// tracer makes each event's publish span; nil is tracing off.
	tracer trace.Tracer

	replicas atomic.Int64 // see StreamReplicas
	// session is the configuration of the claim and LISTEN connections
	// (WithSessionConfig; default the pool's).
	session *pgx.ConnConfig
}

// Option configures a Relay.
type Option func(*Relay)

// WithHooks installs test hooks.
func WithHooks(h Hooks) Option { return func(r *Relay) { r.hooks = h } }

// WithSessionConfig makes the relay's claim and LISTEN connections — the
// ones whose session state (advisory locks, LISTEN) must last — use cc
// (QUILL_RELAY_DATABASE_URL) instead of the pool's configuration: they need
// PostgreSQL directly or a session pooler, while the pool, which only runs
// transactions, may go through a transaction pooler.
func WithSessionConfig(cc *pgx.ConnConfig) Option { return func(r *Relay) { r.session = cc } }

// WithTracer makes a span of each event's publish (tracing.Provider.Tracer;
// nil, the default, is tracing off), the child of the span that wrote the
// event, whose trace context the outbox row stores; the message carries
// the publish span's, so that a consumer's handling is its child. With
// tracing off the message carries the stored trace context as it is.
func WithTracer(t trace.Tracer) Option { return func(r *Relay) { r.tracer = t } }

// WithID names the relay in its claims (default host-pid-random).
func WithID(id string) Option { return func(r *Relay) { r.id = id } }

// ConnOptions are the options a relay's NATS connection must have: no
// reconnect buffer, so that a publish while the connection is down fails at
// once and its event stays in the outbox. A buffered publish would be sent
// whenever the connection comes back — perhaps after another relay has
// published that event and the note's next one, past the duplicate window,
// putting the note's events out of order in the stream.
func ConnOptions() []nats.Option { return []nats.Option{nats.ReconnectBufSize(-1)} }

// ErrReconnectBuffer is returned by New for a connection made without
// ConnOptions.
var ErrReconnectBuffer = errors.New("the relay's NATS connection must not buffer publishes while reconnecting (relay.ConnOptions)")

// New returns a relay over pool and nc, a connection made with
// ConnOptions. It returns an error when the configuration does not
// validate, ErrReconnectBuffer when nc would buffer publishes, or an error
// when JetStream cannot be set up.
func New(pool *pgxpool.Pool, nc *nats.Conn, cfg Config, log zerolog.Logger, m *metrics.Relay, opts ...Option) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if nc.Opts.ReconnectBufSize >= 0 {
		return nil, ErrReconnectBuffer
	}
	// Two batches are in flight at most: one waiting for its acks and
	// its mark, the next claimed and published meanwhile.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(2*cfg.Batch))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	r := &Relay{pool: pool, nc: nc, js: js, cfg: cfg, log: log, m: m, id: defaultID(), wake: make(chan struct{}, 1)}
	for _, o := range opts {
		o(r)
	}
	if r.session == nil {
		r.session = pool.Config().ConnConfig
	}
	return r, nil
}

func defaultID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = crand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Provision creates the stream when it is missing, or sets what Quill owns
// of an existing one (see stream.Provision). The error wraps JetStream's.
func (r *Relay) Provision(ctx context.Context) error {
	st, err := stream.Provision(ctx, r.js, r.cfg.Stream)
	if err != nil {
		return err
	}
	r.replicas.Store(int64(st.CachedInfo().Config.Replicas))
	return nil
}

// StreamReplicas returns the stream's replicas as the last Provision found
// or made them, 0 before any.
func (r *Relay) StreamReplicas() int { return int(r.replicas.Load()) }

// Ready reports whether NATS is connected and PostgreSQL answers (see
// metrics.CheckConnected).
func (r *Relay) Ready(ctx context.Context) error { return metrics.CheckConnected(ctx, r.nc, r.pool) }

// Wake asks for a pass now.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays events until ctx ends, then finishes the pass in flight and
// returns nil. Failures of NATS or PostgreSQL are retried with backoff.
func (r *Relay) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.publishLoop(ctx) })
	g.Go(func() error { return r.listenLoop(ctx) })
	g.Go(func() error { return r.statsLoop(ctx) })
	return g.Wait()
}

// batch is one claim's events on their way to the stream.
type batch struct {
	session uint64 // the claim session holding the events' locks
	events  []outbox.Pending
	futures []jetstream.PubAckFuture
	failed  []error
	// spans are the events' publish spans, ended when their
	// acknowledgement or failure arrives; nil with tracing off.
	spans []trace.Span
}

// endSpan ends the publish span of b's i-th event, failed with err when
// err is not nil.
func (b *batch) endSpan(i int, err error, attrs ...attribute.KeyValue) {
	if b.spans == nil {
		return
	}
	span := b.spans[i]
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// logCtx is the context of log lines about b's i-th event: its publish
// span's, so that they carry its trace_id.
func (b *batch) logCtx(i int) context.Context {
	if b.spans == nil {
		return context.Background()
	}
	return trace.ContextWithSpanContext(context.Background(), b.spans[i].SpanContext())
}

// pipeline is the state of Run's publish loop. The claimer (the loop's
// goroutine) owns the claim session and claims; the publisher publishes
// each claimed batch and hands it to the marker, which waits for the acks,
// marks, parks or releases and hands the batch back; the claimer then ends
// its claims with its next claim statement. So the claim of batch N+2, the
// publish of N+1 and the ack wait and mark of N overlap, and a claim ends
// only after its event is marked. The claimer bounds one relay's
// throughput, so it does nothing but claim.
type pipeline struct {
	r       *Relay
	conn    *pgx.Conn // the claim session; nil until (re)connected
	space   int32     // the advisory lock space of the outbox
	session uint64    // counts claim sessions
	// held: events claimed and not yet handed back — excluded from
	// claims, as an advisory lock is re-entrant within its session.
	held map[int64]bool
	// unlock: events handed back whose claims the session still holds.
	unlock []int64

	mu       sync.Mutex // guards what the marker hands back
	finished []*batch
	failure  error // the first failure since the claimer last looked
	ok       bool  // a batch finished without failure
}

// markers is how many batches may be marked at once: the mark is the
// pipeline's longest stage, and batches' marks are independent (a note has
// at most one event in flight).
const markers = 2

func (r *Relay) publishLoop(ctx context.Context) error {
	p := &pipeline{r: r, held: map[int64]bool{}}
	claimed := make(chan *batch)
	handoff := make(chan *batch)
	markerDone := make(chan struct{})
	go func() {
		defer close(handoff)
		for b := range claimed {
			handoff <- r.publish(b.session, b.events)
		}
	}()
	go func() {
		defer close(markerDone)
		var wg sync.WaitGroup
		slots := make(chan struct{}, markers)
		// Wait for each batch's acks in turn, so at most two batches
		// have acks pending (the one waited for and the next one
		// published), and mark them in the background.
		for b := range handoff {
			acks := r.awaitAcks(ctx, b)
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := r.settle(ctx, b, acks)
				<-slots
				p.handBack(b, err)
			}()
		}
		wg.Wait()
	}()
	p.claimLoop(ctx, claimed)
	// Finish what is in flight, then end the session: its claims go.
	close(claimed)
	<-markerDone
	p.closeSession()
	return nil
}

// handBack returns a finished batch to the claimer.
func (p *pipeline) handBack(b *batch, err error) {
	p.mu.Lock()
	p.finished = append(p.finished, b)
	if err != nil && p.failure == nil {
		p.failure = err
	}
	p.ok = p.ok || err == nil
	p.mu.Unlock()
	// Later events of the notes just marked may be claimable now, and
	// nothing else would wake the claimer for them.
	p.r.Wake()
}

func (p *pipeline) claimLoop(ctx context.Context, claimed chan<- *batch) {
	r := p.r
	b := wait.Backoff{Base: 50 * time.Millisecond, Max: r.cfg.MaxBackoff}
	for ctx.Err() == nil {
		failure, ok := p.collect()
		if failure != nil {
			d := b.Next()
			r.log.Warn().Err(failure).Str("error_category", category(failure)).Dur("retry_in", d).Msg("relay pass failed; backing off")
			p.wait(ctx, d, nil)
			continue
		}
		if ok {
			b.Reset()
		}
		events, err := p.claim(ctx)
		if err != nil {
			d := b.Next()
			r.log.Warn().Err(err).Str("error_category", category(err)).Dur("retry_in", d).Msg("relay claim failed; backing off")
			p.wait(ctx, d, nil)
			continue
		}
		if len(events) == 0 {
			p.wait(ctx, r.cfg.PollInterval, r.wake)
			continue
		}
		// Claim again at once after handing the batch over: a partial
		// batch does not mean the queue is empty.
		p.hand(claimed, &batch{session: p.session, events: events})
	}
}

// The claim session ends after Lease of idleness (idle_session_timeout),
// and with it the claims of a relay process that hangs. A working claimer
// is never idle that long: while it sleeps or waits to hand a batch over,
// it touches the session every third of the lease.

// wait sleeps for d, until wake (when not nil) or until ctx ends, touching
// the claim session every third of the lease.
func (p *pipeline) wait(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	deadline := time.Now().Add(d)
	for {
		step := min(time.Until(deadline), p.touchEvery())
		if step <= 0 {
			return
		}
		t := time.NewTimer(step)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
			t.Stop()
			return
		case <-t.C:
		}
		if time.Until(deadline) > 0 {
			p.touch()
		}
	}
}

// hand gives b to the publisher, touching the claim session every third of
// the lease while the publisher is busy.
func (p *pipeline) hand(claimed chan<- *batch, b *batch) {
	t := time.NewTicker(p.touchEvery())
	defer t.Stop()
	for {
		select {
		case claimed <- b:
			return
		case <-t.C:
			p.touch()
		}
	}
}

// touchEvery is a third of the claim session's idle timeout.
func (p *pipeline) touchEvery() time.Duration { return p.r.sessionLease() / 3 }

// touch runs an empty statement on the claim session, so that it does not
// reach its idle timeout; a session that fails it is ended (its claims are
// gone anyway) and the next claim opens another.
func (p *pipeline) touch() {
	if p.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.r.cfg.Lease)
	defer cancel()
	if _, err := p.conn.Exec(ctx, ";"); err != nil {
		p.r.log.Warn().Err(err).Str("error_category", category(fmt.Errorf("%w: %w", errDatabase, err))).Msg("claim session lost")
		p.closeSession()
	}
}

// collect takes the batches the marker handed back: their events leave
// held, and their claims are ended by the next claim statement (unless the
// session that took them is gone, and its claims with it).
func (p *pipeline) collect() (failure error, ok bool) {
	p.mu.Lock()
	finished, failure, ok := p.finished, p.failure, p.ok
	p.finished, p.failure, p.ok = nil, nil, false
	p.mu.Unlock()
	for _, b := range finished {
		for _, e := range b.events {
			delete(p.held, e.Seq)
			if p.conn != nil && b.session == p.session {
				p.unlock = append(p.unlock, e.Seq)
			}
		}
	}
	return failure, ok
}

// claim ends the claims in p.unlock and claims the next batch, connecting
// the claim session first when needed. It is not cut short by ctx: that
// would end the session, and the claims of the batch in flight with it.
func (p *pipeline) claim(ctx context.Context) ([]outbox.Pending, error) {
	r := p.r
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Lease)
	defer cancel()
	if p.conn == nil {
		conn, space, err := r.connect(cctx)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errDatabase, err)
		}
		p.conn, p.space = conn, space
		p.session++
	}
	held := make([]int64, 0, len(p.held))
	for seq := range p.held {
		held = append(held, seq)
	}
	events, err := outbox.Claim(cctx, p.conn, p.space, p.unlock, held, r.cfg.Batch)
	if err != nil {
		// The session may hold claims we do not know of: end it.
		p.closeSession()
		return nil, fmt.Errorf("%w: %w", errDatabase, err)
	}
	p.unlock = p.unlock[:0]
	for _, e := range events {
		p.held[e.Seq] = true
	}
	return events, nil
}

// closeSession ends the claim session, and with it every claim it held.
func (p *pipeline) closeSession() {
	if p.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.conn.Close(ctx)
	p.conn, p.unlock = nil, nil
}

// connect opens a claim session: a connection of its own (never a pooled
// one, whose session other work would share), on which the server detects
// a vanished or hung relay within about the lease.
func (r *Relay) connect(ctx context.Context) (*pgx.Conn, int32, error) {
	settings := r.keepalives()
	// A relay that hangs keeps its connection open: PostgreSQL ends the
	// session, and its claims, once it has been idle for the lease (a
	// working claimer touches it more often: see wait).
	settings["idle_session_timeout"] = strconv.FormatInt(r.sessionLease().Milliseconds(), 10)
	maps.Copy(settings, outbox.SessionParams())
	conn, err := pgx.ConnectConfig(ctx, r.sessionConfig(settings))
	if err != nil {
		return nil, 0, fmt.Errorf("claim session: %w", err)
	}
	space, err := outbox.LockSpace(ctx, conn)
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, 0, err
	}
	return conn, space, nil
}

// sessionConfig is the session connections' configuration with settings
// applied by SET right after connecting, not as startup parameters, which
// a session pooler such as PgBouncer refuses; a session connection is made
// rarely, so the round trip costs nothing that matters.
func (r *Relay) sessionConfig(settings map[string]string) *pgx.ConnConfig {
	cc := r.session.Copy()
	settings = maps.Clone(settings)
	if _, ok := cc.RuntimeParams["statement_timeout"]; !ok {
		// As every pool's sessions (db.StatementTimeout): a claim is an
		// index walk, LISTEN returns at once, and waiting for a
		// notification is no statement.
		settings["statement_timeout"] = db.StatementTimeout
	}
	names := slices.Sorted(maps.Keys(settings))
	var sql strings.Builder
	for _, name := range names {
		fmt.Fprintf(&sql, "SET %s TO '%s'; ", name, settings[name])
	}
	after := cc.AfterConnect
	cc.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		if _, err := c.Exec(ctx, sql.String()).ReadAll(); err != nil {
			return fmt.Errorf("session settings: %w", err)
		}
		return nil
	}
	return cc
}

// sessionLease is the lease as the relay's PostgreSQL sessions apply it:
// at least a second, the unit of TCP keepalive settings.
func (r *Relay) sessionLease() time.Duration { return max(r.cfg.Lease, time.Second) }

// keepaliveProbe is the idle time before, and the interval between, TCP
// keepalive probes: two unanswered ones end a connection within the lease.
func (r *Relay) keepaliveProbe() time.Duration { return r.sessionLease() / 3 }

// keepalives are the session settings with which the server detects a
// relay connection gone silent within about the lease.
func (r *Relay) keepalives() map[string]string {
	probe := strconv.Itoa(max(int(r.keepaliveProbe()/time.Second), 1))
	return map[string]string{
		"tcp_keepalives_idle":     probe,
		"tcp_keepalives_interval": probe,
		"tcp_keepalives_count":    "2",
		"tcp_user_timeout":        strconv.FormatInt(r.sessionLease().Milliseconds(), 10),
	}
}

// errTransient wraps failures a later pass can overcome.
var errTransient = errors.New("transient")

func category(err error) string {
	switch {
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrReconnectBufExceeded):
		return "nats_unavailable"
	case errors.Is(err, errDatabase):
		return "database_unavailable"
	default:
		return "publish_failed"
	}
}

var errDatabase = errors.New("database")

// Pass claims one batch on a claim session of its own, publishes it, waits
// for the acknowledgements, marks the acknowledged events published and
// ends the session. It returns how many events it claimed. Permanent
// failures park their event; transient ones record the attempt and return
// an error. A pass in flight completes even when ctx ends. Run does the
// same work with the passes overlapping.
func (r *Relay) Pass(ctx context.Context) (int, error) {
	conn, space, err := r.connect(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errDatabase, err)
	}
	// The session's end releases every claim.
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	events, err := outbox.Claim(ctx, conn, space, nil, nil, r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errDatabase, err)
	}
	if len(events) == 0 {
		return 0, nil
	}
	return len(events), r.finish(ctx, r.publish(0, events))
}

// publish sends a claimed batch without waiting for the acknowledgements.
func (r *Relay) publish(session uint64, events []outbox.Pending) *batch {
	b := &batch{session: session, events: events,
		futures: make([]jetstream.PubAckFuture, len(events)), failed: make([]error, len(events))}
	if r.tracer != nil {
		b.spans = make([]trace.Span, len(events))
	}
	for i, e := range events {
		msg := r.message(e)
		if b.spans != nil {
			b.spans[i] = r.startSpan(e, msg)
		}
		b.futures[i], b.failed[i] = r.js.PublishMsgAsync(msg, jetstream.WithStallWait(r.cfg.AckTimeout))
		if b.failed[i] != nil {
			b.endSpan(i, b.failed[i])
		}
	}
	return b
}

// startSpan starts e's publish span, a child of the trace context stored
// with e, and sets msg's traceparent and tracestate to the span's.
func (r *Relay) startSpan(e outbox.Pending, msg *nats.Msg) trace.Span {
	ctx := tracing.Extract(context.Background(), e.Traceparent, e.Tracestate)
	ctx, span := r.tracer.Start(ctx, "send "+e.Type, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(msg.Subject), semconv.MessagingMessageID(e.ID.String()),
		attribute.String("quill.tenant", e.Tenant), attribute.Int("quill.attempts", e.Attempts)))
	delete(msg.Header, "traceparent")
	delete(msg.Header, "tracestate")
	tracing.InjectHeader(ctx, tracing.Header(msg.Header))
	return span
}

// finish waits for a published batch's acknowledgements and marks the
// acknowledged events published (awaitAcks, then settle). It completes even
// when ctx ends. The caller ends the batch's claims afterwards.
func (r *Relay) finish(ctx context.Context, b *batch) error {
	return r.settle(ctx, b, r.awaitAcks(ctx, b))
}

// awaitAcks waits for a batch's acknowledgements, at most the ack timeout
// plus the lease, and returns them; failures go to b.failed.
func (r *Relay) awaitAcks(ctx context.Context, b *batch) []outbox.Published {
	events, failed := b.events, b.failed
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout+r.cfg.Lease)
	defer cancel()
	acks := make([]outbox.Published, 0, len(events))
	for i, f := range b.futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			acks = append(acks, outbox.Published{Seq: events[i].Seq, StreamSeq: ack.Sequence, Duplicate: ack.Duplicate})
			r.m.Published.Inc()
			if ack.Duplicate {
				r.m.Duplicates.Inc()
			}
			b.endSpan(i, nil, attribute.Int64("quill.stream_seq", int64(ack.Sequence)), attribute.Bool("quill.duplicate", ack.Duplicate))
		case err := <-f.Err():
			failed[i] = err
			b.endSpan(i, err)
		case <-pctx.Done():
			failed[i] = pctx.Err()
			b.endSpan(i, failed[i])
		}
	}
	return acks
}

// settle marks a batch's acknowledged events published. Permanent failures
// park their event; transient ones record the attempt and make settle
// return an error, so the caller backs off. It completes even when ctx
// ends.
func (r *Relay) settle(ctx context.Context, b *batch, acks []outbox.Published) error {
	events, failed := b.events, b.failed
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout+r.cfg.Lease)
	defer cancel()
	if r.hooks.AfterAck != nil {
		if err := r.hooks.AfterAck(acks); err != nil {
			return err
		}
	}
	if err := outbox.MarkPublished(pctx, r.pool, r.id, acks); err != nil {
		// Published but not marked: once the claims end, a later pass
		// republishes them; the stream drops the duplicates.
		return fmt.Errorf("%w: %w", errDatabase, err)
	}
	var release []int64
	var firstTransient error
	missing := false
	for i, err := range failed {
		if err == nil {
			continue
		}
		r.m.Errors.Inc()
		e := events[i]
		if streamMissing(err) {
			missing = true
		}
		if reason, permanent := r.permanent(pctx, e, err); permanent {
			r.log.Error().Ctx(b.logCtx(i)).Str("event_id", e.ID.String()).Str("type", e.Type).Str("tenant", e.Tenant).
				Str("error_category", "event_parked").Str("reason", reason).Msg("event parked: it cannot be published as it is")
			if perr := outbox.Park(pctx, r.pool, e.Seq, reason); perr != nil {
				return fmt.Errorf("%w: %w", errDatabase, perr)
			}
			continue
		}
		release = append(release, e.Seq)
		if firstTransient == nil {
			firstTransient = err
		}
	}
	if missing {
		r.reprovision(pctx, firstTransient)
	}
	if len(release) > 0 {
		if err := outbox.Release(pctx, r.pool, release, firstTransient.Error()); err != nil {
			return fmt.Errorf("%w: %w", errDatabase, err)
		}
		return fmt.Errorf("%w: publish %d of %d events: %w", errTransient, len(release), len(events), firstTransient)
	}
	return nil
}

func (r *Relay) message(e outbox.Pending) *nats.Msg {
	msg := nats.NewMsg(contract.Subject(r.cfg.Stream.SubjectPrefix, e.Tenant, e.Type))
	msg.Data = e.Payload
	msg.Header.Set(jetstream.MsgIDHeader, e.ID.String())
	msg.Header.Set("Content-Type", "application/cloudevents+json")
	if e.Traceparent != "" {
		msg.Header.Set("traceparent", e.Traceparent)
		if e.Tracestate != "" {
			msg.Header.Set("tracestate", e.Tracestate)
		}
	}
	return msg
}

// permanent decides whether a publish failure can never succeed as the
// event is: a payload over the server's limit, or the stream refusing the
// message. Anything else — no responders while JetStream restarts or the
// stream is gone (streamMissing), timeouts, a closed connection — is
// transient.
func (r *Relay) permanent(_ context.Context, e outbox.Pending, err error) (string, bool) {
	if streamMissing(err) {
		return "", false
	}
	if reason, ok := refusal(err); ok {
		return reason, true
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Sprintf("payload of %d bytes exceeds the NATS server's max_payload of %d", len(e.Payload), r.nc.MaxPayload()), true
	}
	return "", false
}

// streamMissing reports a publish answer that says no stream took the
// message: no responders (no stream captures the subject: the stream was
// deleted, or its subjects changed) or stream not found. The relay owns the
// stream's subjects, so each means the stream must be provisioned again —
// never that the event is wrong.
func streamMissing(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamNotFound)
}

// reprovision provisions the stream again after a publish found it
// missing (cause). A failure is logged; the caller backs off and the next
// pass tries again.
func (r *Relay) reprovision(ctx context.Context, cause error) {
	r.m.Reprovisions.Inc()
	if err := r.Provision(ctx); err != nil {
		r.log.Warn().Err(err).AnErr("cause", cause).Str("stream", r.cfg.Stream.Name).Str("error_category", "stream_missing").
			Msg("the stream is missing and could not be provisioned again; events wait in the outbox, retrying with backoff")
		return
	}
	r.log.Warn().AnErr("cause", cause).Str("stream", r.cfg.Stream.Name).Str("error_category", "stream_missing").
		Int("replicas", r.StreamReplicas()).Msg("the stream was missing: provisioned it again; republishing with backoff")
}

// refusal reports a JetStream API error that refuses the message for good:
// a 4xx answer, except 409 and 429. A 409 "duplicate message id is in
// process" comes from a replicated stream still storing an earlier publish
// of the same event (after an ack timeout, or two relays after a takeover):
// the next attempt gets the duplicate ack. A 429 is a rate or in-flight
// limit. Parking either would hold the note's later events back until an
// operator retried it. 5xx answers (JetStream unavailable, store failed)
// are transient too.
func refusal(err error) (string, bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return "", false
	}
	switch {
	case apiErr.Code == http.StatusConflict, apiErr.Code == http.StatusTooManyRequests:
		return "", false
	case apiErr.Code >= 400 && apiErr.Code < 500:
		return "the stream refused the message: " + apiErr.Error(), true
	}
	return "", false
}

// listenLoop keeps a connection LISTENing to the outbox channel and wakes
// the publish loop on each notification; polling covers its outages.
func (r *Relay) listenLoop(ctx context.Context) error {
	b := wait.Backoff{Base: 100 * time.Millisecond, Max: r.cfg.MaxBackoff}
	for ctx.Err() == nil {
		listening, err := r.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if listening {
			// The backoff is for connections that fail; one that
			// listened and was lost later starts over.
			b.Reset()
		}
		d := b.Next()
		r.log.Warn().Err(err).Str("error_category", "listen_failed").Dur("retry_in", d).Msg("LISTEN connection lost; polling meanwhile")
		wait.For(ctx, d)
	}
	return nil
}

// listen LISTENs on a connection of its own and wakes the publish loop on
// each notification until the connection fails or ctx ends; listening
// reports whether the LISTEN took effect. The connection only ever reads,
// so keepalive probes from the relay's side (and the claim session's
// server-side settings) make a silent partition end it within about the
// lease, instead of leaving the relay to its polling unawares.
func (r *Relay) listen(ctx context.Context) (listening bool, err error) {
	cc := r.sessionConfig(r.keepalives())
	probe := max(r.keepaliveProbe(), time.Second)
	dialer := &net.Dialer{Timeout: r.cfg.Lease,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: probe, Interval: probe, Count: 2}}
	cc.DialFunc = dialer.DialContext
	// Connecting and LISTEN are bounded by the lease: unanswered, they
	// would wait for TCP to give up.
	sctx, cancel := context.WithTimeout(ctx, r.cfg.Lease)
	defer cancel()
	conn, err := pgx.ConnectConfig(sctx, cc)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(sctx, "LISTEN "+outbox.NotifyChannel); err != nil {
		return false, err
	}
	r.Wake() // catch up with whatever committed while not listening
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		r.Wake()
	}
}

func (r *Relay) statsLoop(ctx context.Context) error {
	for {
		// Every relay reports the whole outbox's backlog: the gauges
		// are aggregated with max, not sum (decision 0057).
		if b, err := outbox.Backlog(ctx, r.pool); err == nil {
			r.m.Pending.Set(float64(b.Pending))
			r.m.Parked.Set(float64(b.Parked))
			r.m.OldestAge.Set(b.OldestAge)
		}
		if !wait.For(ctx, statsInterval) {
			return nil
		}
	}
}
