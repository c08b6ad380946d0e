package dispatch

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/whsecret"
)

// markTimeout bounds the statements that record an attempt.
const markTimeout = 10 * time.Second

// Dispatcher consumes the events into delivery rows and sends them.
type Dispatcher struct {
	pool   *pgxpool.Pool
	nc     *nats.Conn
	cfg    Config
	keys   *whsecret.Keys
	client *http.Client
	log    zerolog.Logger
	m      *Metrics
	st     store
	mk     *marker
	c      *consumer.Consumer
	now    func() time.Time

	// wake is signalled after a consumer commit that recorded deliveries
	// and when a send ends (a slot is free).
	wake chan struct{}

	// mu guards inflight (POSTs in flight by endpoint), held (deliveries
	// claimed and not yet marked, by endpoint), queued (deliveries claimed
	// ahead for an endpoint at its concurrency, each sent when one of its
	// POSTs ends) and total (sends: a POST and its mark).
	mu       sync.Mutex
	inflight map[uuid.UUID]int
	held     map[uuid.UUID]int
	queued   map[uuid.UUID][]claimed
	total    int
	sends    sync.WaitGroup
}

// New returns a dispatcher consuming js's stream under cc (its Durable,
// Stream and FilterSubjects set by the caller; Versions, Logger,
// Concurrency and MaxBatch (cfg.Batch) and the stages are the
// dispatcher's) and sending with the endpoints' secrets
// opened by keys. reg, when not nil, receives the consumer package's
// metrics. It returns an error for a configuration that does not
// validate or a TLS CA file that cannot be read.
func New(pool *pgxpool.Pool, nc *nats.Conn, cc consumer.Config, cfg Config, keys *whsecret.Keys, log zerolog.Logger, m *Metrics, reg prometheus.Registerer) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client, err := NewClient(cfg.AllowPrivate, cfg.TLSCA, cfg.EndpointConcurrency)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{pool: pool, nc: nc, cfg: cfg, keys: keys, client: client, log: log, m: m, st: store{pool}, mk: newMarker(store{pool}),
		now: time.Now, wake: make(chan struct{}, 1), inflight: map[uuid.UUID]int{}, held: map[uuid.UUID]int{}, queued: map[uuid.UUID][]claimed{}}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	cc.Versions = consumer.VersionsInOrder
	// Held at once and committed together: with the consumer's default
	// (4) a transaction recorded ~3.5 events, and the recording, not the
	// POSTs, bounded the throughput (decision 0089).
	cc.Concurrency, cc.MaxBatch = cfg.Batch, cfg.Batch
	if cc.MaxAckPending != 0 && cc.MaxAckPending < cfg.Batch {
		return nil, fmt.Errorf("QUILL_WEBHOOK_BATCH %d must not be above the consumer's MaxAckPending %d", cfg.Batch, cc.MaxAckPending)
	}
	cc.Logger = slog.New(zerolog.NewSlogHandler(log))
	cc.Registerer = reg
	d.c, err = consumer.NewStaged(pool, js, cc, consumer.Stages{Apply: d.apply, Committed: d.committed})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	return d, nil
}

// apply records, in the consumer's transaction, the deliveries of every
// event of the batch, in one statement.
func (d *Dispatcher) apply(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
	evs := make([]recordable, 0, len(items))
	byID := make(map[uuid.UUID][]*consumer.Item, len(items))
	for _, it := range items {
		ev := it.Event
		id, err := uuid.Parse(ev.ID)
		if err != nil {
			it.Err = consumer.Permanent(err)
			continue
		}
		r := recordable{tenant: ev.Tenant, id: id, eventType: ev.Type, payload: ev.Payload, time: ev.Time}
		if a, err := uuid.Parse(ev.Subject); err == nil {
			r.aggregate = pgtype.UUID{Bytes: a, Valid: true}
		}
		if v, ok := ev.Version(); ok {
			r.version = pgtype.Int8{Int64: v, Valid: true}
		}
		evs = append(evs, r)
		byID[id] = append(byID[id], it)
	}
	if len(evs) == 0 {
		return nil
	}
	got, err := insertDeliveries(ctx, tx, evs)
	if err != nil {
		return err
	}
	for id := range got {
		for _, it := range byID[id] {
			it.Result = "recorded"
		}
	}
	return nil
}

// committed wakes the sender when a commit recorded deliveries.
func (d *Dispatcher) committed(items []*consumer.Item) {
	for _, it := range items {
		if it.Result == "recorded" {
			d.signal()
			return
		}
	}
}

func (d *Dispatcher) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Ready reports why the dispatcher cannot consume, else whether NATS is
// connected and PostgreSQL answers.
func (d *Dispatcher) Ready(ctx context.Context) error {
	if err := d.c.Ready(ctx); err != nil {
		if cerr := metrics.CheckConnected(ctx, d.nc, d.pool); cerr != nil {
			return cerr
		}
		return err
	}
	return metrics.CheckConnected(ctx, d.nc, d.pool)
}

// Run consumes, sends and keeps the table until ctx ends; then it stops
// claiming, lets the POSTs in flight end (each bounded by the timeout) and
// marks them. It returns the consumer's error.
func (d *Dispatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.send(ctx) }()
	go func() { defer wg.Done(); d.maintain(ctx) }()
	// The marker outlives the sends: it records their last successes.
	stopMarks, marked := make(chan struct{}), make(chan struct{})
	go func() { defer close(marked); d.mk.run(stopMarks) }()
	err := d.c.Run(ctx)
	wg.Wait()
	d.sends.Wait()
	close(stopMarks)
	<-marked
	d.releaseQueued()
	d.client.CloseIdleConnections()
	return err
}

// send claims due deliveries while there is room and starts their POSTs;
// it waits for a wake-up, a free slot or the poll in between.
func (d *Dispatcher) send(ctx context.Context) {
	tick := time.NewTicker(d.cfg.PollInterval)
	defer tick.Stop()
	for {
		full := d.claimOnce(ctx)
		if full && ctx.Err() == nil {
			continue // there may be more due
		}
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-tick.C:
		}
	}
}

// claimOnce claims as many deliveries as there is room for and starts
// them; it reports whether it claimed as many as it asked for. The
// endpoints this process is sending to are claimed for up to their room
// each (claimFor); the rest of the free slots go to every other endpoint
// (claim).
func (d *Dispatcher) claimOnce(ctx context.Context) bool {
	d.mu.Lock()
	free := d.cfg.Concurrency - d.total
	// Every endpoint this process holds deliveries of is claimed for apart,
	// up to its room: in the general claim it would be asked for every
	// free slot, and the rows past its room given back.
	busy := make([]uuid.UUID, 0, len(d.held))
	var open []uuid.UUID
	var rooms []int
	for ep := range d.held {
		busy = append(busy, ep)
		if room := d.cfg.EndpointConcurrency - d.inflight[ep] + d.queueCap() - len(d.queued[ep]); room > 0 {
			open, rooms = append(open, ep), append(rooms, room)
		}
	}
	d.mu.Unlock()
	if free <= 0 {
		return false
	}
	var cs []claimed
	var err error
	leasedAt := d.now()
	if len(open) > 0 {
		cs, err = d.st.claimFor(ctx, d.cfg.lease(), open, rooms)
	}
	if err == nil && len(cs) < free {
		var more []claimed
		more, err = d.st.claim(ctx, d.cfg.lease(), free-len(cs), busy)
		cs = append(cs, more...)
	}
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn().Err(err).Str("error_category", "database").Msg("cannot claim webhook deliveries; trying again")
		}
		if len(cs) == 0 {
			return false
		}
	}
	var excess []claimed
	d.mu.Lock()
	for _, c := range cs {
		c.leasedAt = leasedAt
		switch {
		case d.inflight[c.endpoint] < d.cfg.EndpointConcurrency:
			d.inflight[c.endpoint]++
			d.held[c.endpoint]++
			d.start(ctx, c)
		case len(d.queued[c.endpoint]) < d.queueCap():
			d.queued[c.endpoint] = append(d.queued[c.endpoint], c)
			d.held[c.endpoint]++
		default:
			excess = append(excess, c)
		}
	}
	d.mu.Unlock()
	if len(excess) > 0 {
		// A claim took more of one endpoint's deliveries than it may send
		// at once or queue: give them back at once, so they wait for that
		// endpoint and hold no slot another endpoint could use.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
		defer cancel()
		if err := d.st.release(rctx, excess); err != nil {
			d.log.Warn().Err(err).Msg("cannot give back webhook deliveries; their lease runs out")
		}
	}
	return err == nil && len(cs) == free
}

// queueCap is the most deliveries queued for one endpoint at its
// concurrency: claimed ahead, so that a busy endpoint's next POST waits for
// no claim (decision 0089). They hold no slot of QUILL_WEBHOOK_CONCURRENCY;
// a hanging endpoint's queue waits for one of its own POSTs to end and is
// given back when its lease could no longer cover a POST.
func (d *Dispatcher) queueCap() int { return 4 * d.cfg.EndpointConcurrency }

// start starts c's send; d.mu is held, c's endpoint slot taken.
func (d *Dispatcher) start(ctx context.Context, c claimed) {
	d.total++
	d.sends.Add(1)
	go d.deliver(ctx, c)
}

// next hands the POST slot of an endpoint whose POST ended to its next
// queued delivery, and reports whether it did. A queued delivery whose
// lease no longer covers a POST and its mark is given back instead. d.mu
// is held.
func (d *Dispatcher) next(ctx context.Context, ep uuid.UUID) (bool, []claimed) {
	var stale []claimed
	for ctx.Err() == nil && len(d.queued[ep]) > 0 {
		c := d.queued[ep][0]
		d.queued[ep] = d.queued[ep][1:]
		if len(d.queued[ep]) == 0 {
			delete(d.queued, ep)
		}
		if d.now().Add(d.cfg.Timeout + time.Second).After(c.leasedAt.Add(d.cfg.lease())) {
			stale = append(stale, c)
			if d.held[ep]--; d.held[ep] <= 0 {
				delete(d.held, ep)
			}
			continue
		}
		d.start(ctx, c)
		return true, stale
	}
	return false, stale
}

// releaseQueued gives back every queued delivery (at the end of Run).
func (d *Dispatcher) releaseQueued() {
	d.mu.Lock()
	var all []claimed
	for ep, q := range d.queued {
		all = append(all, q...)
		delete(d.queued, ep)
		delete(d.held, ep)
	}
	d.mu.Unlock()
	if len(all) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), markTimeout)
	defer cancel()
	if err := d.st.release(ctx, all); err != nil {
		d.log.Warn().Err(err).Msg("cannot give back webhook deliveries; their lease runs out")
	}
}

// deliver makes one attempt at c and records it. Its POST and marks
// outlive ctx (a graceful stop lets them end), each bounded.
func (d *Dispatcher) deliver(parent context.Context, c claimed) {
	defer func() {
		d.mu.Lock()
		if d.held[c.endpoint]--; d.held[c.endpoint] <= 0 {
			delete(d.held, c.endpoint)
		}
		d.total--
		d.mu.Unlock()
		d.sends.Done()
		d.signal()
	}()
	ctx := context.WithoutCancel(parent)
	a := d.post(ctx, c)
	// The endpoint's slot is its POSTs in flight: free once the POST has
	// ended, before the mark (the row stays leased, so no claim takes it
	// meanwhile; the next version of its note waits for the mark). Held
	// through the mark, every slot of a busy endpoint waited for two
	// commits per POST, its claim's and its mark's (decision 0089). The
	// process's slot (Concurrency) is held until the mark, bounding the
	// marks in flight too.
	d.mu.Lock()
	handed, stale := d.next(parent, c.endpoint)
	if !handed {
		if d.inflight[c.endpoint]--; d.inflight[c.endpoint] <= 0 {
			delete(d.inflight, c.endpoint)
		}
	}
	d.mu.Unlock()
	if len(stale) > 0 {
		rctx, cancel := context.WithTimeout(ctx, markTimeout)
		if err := d.st.release(rctx, stale); err != nil {
			d.log.Warn().Err(err).Msg("cannot give back webhook deliveries; their lease runs out")
		}
		cancel()
	}
	d.signal()
	mctx, cancel := context.WithTimeout(ctx, markTimeout)
	defer cancel()
	if err := d.record(mctx, c, a); err != nil {
		d.log.Warn().Err(err).Int64("delivery", c.id).Msg("cannot record a webhook attempt; the lease runs out and it is sent again under the same id")
	}
}

// post sends c once.
func (d *Dispatcher) post(ctx context.Context, c claimed) attempt {
	u, err := checkURL(c.url, d.cfg.AllowPrivate)
	if err != nil {
		return attempt{err: err}
	}
	secrets := make([]string, 0, 2)
	for _, sealed := range [][]byte{c.sealed, c.prevSealed} {
		if sealed == nil {
			continue
		}
		s, err := d.keys.Open(sealed, c.tenant, c.endpoint.String())
		if err != nil {
			return attempt{err: fmt.Errorf("cannot open the endpoint's secret with QUILL_WEBHOOK_SECRET_KEY: %w", err)}
		}
		secrets = append(secrets, s)
	}
	id := c.eventID.String()
	ts := d.now().Unix()
	sig, err := whsecret.Sign(secrets, id, ts, c.payload)
	if err != nil {
		return attempt{err: fmt.Errorf("sign: %w", err)}
	}
	pctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodPost, u.String(), bytes.NewReader(c.payload))
	if err != nil {
		return attempt{err: &RefusedError{Reason: "the URL is not a request target"}}
	}
	req.Header.Set("Content-Type", "application/cloudevents+json")
	req.Header.Set("User-Agent", UserAgent)
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := d.client.Do(req)
	if err != nil {
		return attempt{err: err}
	}
	// Read a little of the body (so the connection can be reused), never
	// more: the status is the answer.
	_, _ = io.CopyN(io.Discard, resp.Body, MaxResponseBody)
	resp.Body.Close()
	return attempt{status: resp.StatusCode}
}

// record marks c after attempt a and counts it.
func (d *Dispatcher) record(ctx context.Context, c claimed, a attempt) error {
	var status *int
	if a.status != 0 {
		status = &a.status
	}
	log := d.log.With().Int64("delivery", c.id).Str("endpoint_id", c.endpoint.String()).Str("event_id", c.eventID.String()).
		Int("attempt", c.attempts).Logger()
	switch classify(a) {
	case delivered:
		at := d.now()
		if err := d.mk.delivered(ctx, c, a.status); err != nil {
			return err
		}
		d.m.Deliveries.WithLabelValues(ResultDelivered).Inc()
		d.m.Latency.Observe(max(0, at.Sub(c.eventTime).Seconds()))
		log.Debug().Int("status", a.status).Msg("webhook delivered")
		return nil
	case gone:
		reason := "the endpoint answered 410 Gone"
		if err := d.st.gone(ctx, c, a.status, reason); err != nil {
			return err
		}
		d.m.Deliveries.WithLabelValues(ResultFailed).Inc()
		log.Warn().Str("error_category", "webhook_gone").Msg("endpoint answered 410 Gone: disabled, its pending deliveries failed")
		return d.failUnsendable(ctx, c.endpoint)
	}
	msg := a.describe()
	state, disabled, err := d.st.retry(ctx, c, status, msg, backoff(c.attempts, d.cfg.BackoffMin, d.cfg.BackoffMax, jitter), d.cfg.RetryFor, d.cfg.DisableAfter)
	if err != nil {
		return err
	}
	switch {
	case state == "failed":
		d.m.Deliveries.WithLabelValues(ResultFailed).Inc()
		log.Warn().Str("error", msg).Str("error_category", "webhook_failed").Msg("webhook delivery failed: retried for QUILL_WEBHOOK_RETRY_FOR")
	case a.refused():
		d.m.Deliveries.WithLabelValues(ResultRefused).Inc()
		log.Warn().Str("error", msg).Str("error_category", "webhook_refused").Msg("webhook not sent: the endpoint's address is refused")
	default:
		d.m.Deliveries.WithLabelValues(ResultRetried).Inc()
		log.Info().Str("error", msg).Msg("webhook attempt failed; retrying")
	}
	if disabled {
		log.Warn().Str("error_category", "webhook_disabled").Msg("endpoint failing for QUILL_WEBHOOK_DISABLE_AFTER: disabled, its pending deliveries failed")
		return d.failUnsendable(ctx, c.endpoint)
	}
	return nil
}

func (d *Dispatcher) failUnsendable(ctx context.Context, endpoint uuid.UUID) error {
	n, err := d.st.failUnsendable(ctx, &endpoint)
	if n > 0 {
		d.m.Deliveries.WithLabelValues(ResultFailed).Add(float64(n))
	}
	return err
}

// maintain, at start and every MaintenanceInterval, counts the backlog,
// fails what no one will send (deliveries of disabled and deleted
// endpoints) and deletes settled rows past the retention.
func (d *Dispatcher) maintain(ctx context.Context) {
	tick := time.NewTicker(d.cfg.MaintenanceInterval)
	defer tick.Stop()
	for {
		if err := d.Maintain(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn().Err(err).Str("error_category", "database").Msg("webhook maintenance failed; trying again")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Maintain runs one maintenance pass (see Run). It returns the first
// statement's error.
func (d *Dispatcher) Maintain(ctx context.Context) error {
	n, err := d.st.failUnsendable(ctx, nil)
	if err != nil {
		return err
	}
	if n > 0 {
		d.m.Deliveries.WithLabelValues(ResultFailed).Add(float64(n))
	}
	if _, err := d.st.cleanup(ctx, d.cfg.Retention); err != nil {
		return err
	}
	p, err := d.st.pending(ctx)
	if err != nil {
		return err
	}
	d.m.Pending.Set(float64(p))
	active, disabled, err := d.st.endpoints(ctx)
	if err != nil {
		return err
	}
	d.m.Endpoints.WithLabelValues("active").Set(float64(active))
	d.m.Endpoints.WithLabelValues("disabled").Set(float64(disabled))
	return nil
}
