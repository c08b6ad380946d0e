package consumer

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fetchWait is how long one pull request waits for messages. A request
// lost with a consumer leader that went away costs at most this. The
// shutdown cancels a waiting request at once; a message the server sent
// in that instant is redelivered after its ack wait.
const fetchWait = 5 * time.Second

// ackTimeout bounds the wait for the server's reply to an acknowledgement.
const ackTimeout = 5 * time.Second

// abandonTimeout is how long the shutdown waits, after cancelling the
// handlers' contexts, for those still running to return.
const abandonTimeout = 5 * time.Second

// delivery is one message held by the pool, from its fetch until its ack
// or Nak.
type delivery struct {
	pool     *pool
	msg      jetstream.Msg
	wm       *message.Message
	event    Event // Delivery always set; the rest when parseErr is nil
	parseErr error
	key      string // the ordering key, "" for none
	// alone is set by the group commit once a batch holding d failed: its
	// further attempts run in transactions of their own. Only d's router
	// goroutine reads and writes it.
	alone bool
	// deadErr is why d is a dead letter, once lastDelivery decided it.
	deadErr error
	// heldBack is set by lastDelivery when the version guard held the
	// event back: its Nak has the hold-back delay and result.
	heldBack bool
	// inFlight is the version d counts under in Consumer.inflight
	// (VersionsInOrder), 0 for none.
	inFlight int64

	// Set under pool.mu when the delivery is handed to the router.
	emitted bool
	started time.Time
	cancel  context.CancelFunc
}

type deliveryKey struct{}

// deliveryOf returns the delivery a router message carries in its context.
func deliveryOf(ctx context.Context) *delivery {
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	return d
}

// pool is the one watermill Subscriber of a consumer's router. It fetches
// from the one durable consumer only as many messages as it has free
// slots (Concurrency), hands each to the router — which runs every message
// it receives in a goroutine of its own — and, once the router acked or
// Nak'ed it, acknowledges or Naks the JetStream message and frees the slot.
// Watermill's NATS subscriber instead handles one message per subscription
// at a time, so concurrency there costs a subscription per handler.
type pool struct {
	c     *Consumer
	cons  jetstream.Consumer
	slots chan struct{} // one token per message held

	handlers     context.Context // parent of every handler's context
	stopHandlers context.CancelFunc
	isStopping   atomic.Bool
	held         sync.WaitGroup // deliveries not yet acked or Nak'ed
	mu           sync.Mutex
	closed       bool                   // out is closed
	out          chan *message.Message  // to the router
	routerGone   chan struct{}          // closed when the router stopped
	queues       map[string][]*delivery // OrderBySubject: per busy key, the deliveries waiting behind the running one
}

var _ message.Subscriber = (*pool)(nil)

func newPool(c *Consumer, cons jetstream.Consumer) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	return &pool{
		c: c, cons: cons, slots: make(chan struct{}, c.cfg.Concurrency),
		handlers: ctx, stopHandlers: cancel,
		out: make(chan *message.Message), routerGone: make(chan struct{}), queues: map[string][]*delivery{},
	}
}

// Subscribe implements message.Subscriber: the router's one handler reads
// the pool's messages from the channel it returns.
func (p *pool) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return p.out, nil
}

// Close implements message.Subscriber; the router calls it when it closes,
// after Run drained the pool.
func (p *pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.out)
	}
	return nil
}

func (p *pool) stopping() bool { return p.isStopping.Load() }

func (p *pool) cancelHandlers() { p.stopHandlers() }

// fetch pulls messages until ctx ends: each pull asks for as many messages
// as there are free slots, and waits for at least one free slot first, so
// the process never holds more than Concurrency messages — none waits,
// unreported, in a client buffer while its ack wait runs.
func (p *pool) fetch(ctx context.Context) {
	delay := backoffBase
	for {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n := 1
	more:
		for n < cap(p.slots) {
			select {
			case p.slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := p.cons.Fetch(n, jetstream.FetchContext(fctx))
		got := 0
		if err == nil {
			for m := range batch.Messages() {
				got++
				p.dispatch(ctx, m)
			}
			err = batch.Error()
		}
		cancel()
		for range n - got {
			<-p.slots
		}
		if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			delay = backoffBase
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// NATS away, the consumer deleted under us: wait, provision it
		// again (a no-op when it exists), and go on.
		p.c.setWaiting(errors.Join(errors.New("consumer: NATS: fetch"), err))
		if !sleep(ctx, delay) {
			return
		}
		delay = min(2*delay, backoffMax)
		pctx, pcancel := context.WithTimeout(ctx, provisionTimeout)
		if cons, err := p.c.Provision(pctx); err == nil {
			p.cons = cons
			p.c.setWaiting(nil)
		}
		pcancel()
	}
}

// dispatch takes a fetched message, holding a slot: it starts the
// message's tracking and hands it to the router, or queues it behind the
// running delivery of its key.
func (p *pool) dispatch(ctx context.Context, m jetstream.Msg) {
	d := &delivery{pool: p, msg: m}
	d.event.Delivery = Delivery{Subject: m.Subject(), Header: m.Headers()}
	if meta, err := m.Metadata(); err == nil {
		d.event.Delivery.StreamSeq = meta.Sequence.Stream
		d.event.Delivery.Deliveries = int(meta.NumDelivered)
		d.event.Delivery.Timestamp = meta.Timestamp
	}
	if ev, err := ParseEvent(m.Data(), m.Subject()); err != nil {
		d.parseErr = err
	} else {
		ev.Delivery = d.event.Delivery
		d.event = ev
		if p.c.cfg.OrderBySubject {
			d.key = ev.Tenant + "/" + ev.Subject
		}
		if p.c.cfg.Versions == VersionsInOrder {
			if v, err := ev.version(); err == nil && v > 0 {
				d.inFlight = v
				p.c.inflight.add(keyOf(ev), v)
			}
		}
	}
	d.wm = message.NewMessage(strconv.FormatUint(d.event.Delivery.StreamSeq, 10)+"."+strconv.Itoa(d.event.Delivery.Deliveries), m.Data())
	d.wm.SetContext(context.WithValue(context.Background(), deliveryKey{}, d))
	p.held.Add(1)
	go p.track(d)

	p.mu.Lock()
	defer p.mu.Unlock()
	if ctx.Err() != nil || p.closed || p.stopping() {
		d.wm.Nack() // fetched as the shutdown began: for another process
		return
	}
	if d.key != "" {
		if q, busy := p.queues[d.key]; busy {
			p.queues[d.key] = append(q, d)
			return
		}
		p.queues[d.key] = nil
	}
	p.emit(d)
}

// emit hands d to the router, with a context that ends at the handler
// timeout or when the shutdown gives up on the handlers. p.mu is held.
func (p *pool) emit(d *delivery) {
	ctx, cancel := context.WithTimeout(p.handlers, p.c.cfg.HandlerTimeout)
	d.emitted, d.started, d.cancel = true, time.Now(), cancel
	d.wm.SetContext(context.WithValue(ctx, deliveryKey{}, d))
	// The router's loop receives at once (it starts a goroutine per
	// message), so holding p.mu here is brief; a router that stopped on
	// its own receives nothing, and the message goes back.
	select {
	case p.out <- d.wm:
	case <-p.routerGone:
		d.wm.Nack()
	}
}

// track follows d from its dispatch to its end: it reports the message in
// progress every third of AckWait while it is held, waits for the router's
// ack or Nack, then acknowledges (after the commit, which the handler's
// nil return means) or Naks it, frees its slot, and hands the next
// delivery of its key to the router.
func (p *pool) track(d *delivery) {
	defer p.held.Done()
	if d.inFlight > 0 {
		defer p.c.inflight.remove(keyOf(d.event), d.inFlight)
	}
	cfg := p.c.cfg
	t := time.NewTicker(cfg.AckWait / 3)
	acked := false
wait:
	for {
		select {
		case <-d.wm.Acked():
			acked = true
			break wait
		case <-d.wm.Nacked():
			break wait
		case <-t.C:
			if p.reportable(d) {
				if err := d.msg.InProgress(); err != nil {
					p.c.log.Debug("in progress", "error", err)
				}
			}
		}
	}
	t.Stop()

	p.mu.Lock()
	emitted, cancel := d.emitted, d.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	switch {
	case acked:
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		if err := d.msg.DoubleAck(ctx); err != nil {
			// Committed: a redelivery will be a duplicate.
			p.c.log.Warn("ack failed; the event will be redelivered and found in the inbox", d.event.logAttrs("error", err)...)
		} else {
			p.c.m.acked()
		}
		cancel()
	case p.stopping() || !emitted:
		// Not handled, or cut short by the shutdown: another process
		// may take it at once.
		if err := d.msg.Nak(); err != nil {
			p.c.log.Debug("nak", "error", err)
		}
		if emitted {
			p.c.m.count(d.failedResult())
		}
	default:
		delay := cfg.nakDelay(d.event.Delivery.Deliveries)
		if d.heldBack {
			delay = cfg.holdBackDelay(d.event.Delivery.Deliveries)
		}
		if err := d.msg.NakWithDelay(delay); err != nil {
			p.c.log.Debug("nak", "error", err)
		}
		p.c.m.count(d.failedResult())
	}
	<-p.slots
	if emitted && d.key != "" {
		p.next(d.key)
	}
}

// failedResult is the result a Nak'ed delivery is counted under.
func (d *delivery) failedResult() string {
	if d.heldBack {
		return ResultHeldBack
	}
	return ResultFailed
}

// reportable says whether d is still reported in progress: while it waits
// for its turn, and while its handler runs, up to the handler timeout —
// after which a handler that ignores its context is left to the server's
// redelivery.
func (p *pool) reportable(d *delivery) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !d.emitted || time.Since(d.started) < p.c.cfg.HandlerTimeout
}

// next hands the delivery waiting longest behind key to the router, or
// marks key idle.
func (p *pool) next(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queues[key]
	if len(q) == 0 {
		delete(p.queues, key)
		return
	}
	n := q[0]
	p.queues[key] = q[1:]
	if p.closed || p.stopping() {
		n.wm.Nack()
		return
	}
	p.emit(n)
}

// drain is the shutdown, once fetching stopped: it Naks the deliveries
// still waiting for their key, lets the running handlers finish for up to
// ShutdownTimeout, then cancels their contexts and waits a little more.
func (p *pool) drain() {
	p.isStopping.Store(true)
	p.mu.Lock()
	for key, q := range p.queues {
		for _, d := range q {
			d.wm.Nack()
		}
		p.queues[key] = nil
	}
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		p.held.Wait()
		close(done)
	}()
	grace := time.NewTimer(p.c.cfg.ShutdownTimeout)
	defer grace.Stop()
	select {
	case <-done:
		return
	case <-grace.C:
	}
	p.c.log.Warn("shutdown: cancelling the handlers still running; their messages will be redelivered")
	p.stopHandlers()
	abandon := time.NewTimer(abandonTimeout)
	defer abandon.Stop()
	select {
	case <-done:
	case <-abandon.C:
		p.c.log.Warn("shutdown: handlers ignore their cancelled context; the server will redeliver their messages after the ack wait")
	}
}
