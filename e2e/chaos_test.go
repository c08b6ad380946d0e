package e2e

import (
	"context"
	"fmt"
	"github.com/quillhq/quill/internal/wait"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Fault kinds of the plan.
const (
	fKillAPI      = "kill api"
	fKillRelay    = "kill relay"
	fKillWorker   = "kill worker"
	fRelayMark    = "kill relay between publish and mark"
	fWorkerCommit = "kill worker between commit and ack"
	fNATSStop     = "stop nats"
	fNATSStart    = "start nats"
	fPGRestart    = "restart postgres (fast)"
	fDropBurst    = "drop the next 10 responses"
)

// fault is one planned action, At after the load started.
type fault struct {
	At   time.Duration
	Kind string
}

// faultEvent is what an action did.
type faultEvent struct {
	At     time.Duration // when it ran, since the load started
	Kind   string
	OK     bool // it did what it is for (a hold fired, a restart happened)
	Detail string
}

// planFaults spreads p's faults over the load's planned duration: NATS
// outages and PostgreSQL restarts in separate stretches, random kills
// anywhere, the targeted kills outside NATS outages (the relay can only be
// caught between publish and mark while NATS is up).
func planFaults(p profile, rng *rand.Rand) []fault {
	T := p.Duration()
	at := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(T))
	}
	var plan []fault
	type window struct{ from, to time.Duration }
	var outages []window
	if p.NATSOutages > 0 {
		seg := (0.85*float64(T) - 0.1*float64(T)) / float64(p.NATSOutages)
		for i := range p.NATSOutages {
			lo := 0.1*float64(T) + float64(i)*seg
			hi := max(lo, lo+seg-float64(p.NATSOutage))
			s := time.Duration(lo + rng.Float64()*(hi-lo))
			outages = append(outages, window{s, s + p.NATSOutage})
			plan = append(plan, fault{s, fNATSStop}, fault{s + p.NATSOutage, fNATSStart})
		}
	}
	inOutage := func(t time.Duration, margin time.Duration) bool {
		for _, w := range outages {
			if t >= w.from-margin && t <= w.to+margin {
				return true
			}
		}
		return false
	}
	pick := func(lo, hi float64, margin time.Duration) time.Duration {
		t := at(lo, hi)
		for range 50 {
			if !inOutage(t, margin) {
				break
			}
			t = at(lo, hi)
		}
		return t
	}
	for range p.PGRestarts {
		plan = append(plan, fault{pick(0.1, 0.9, 3*time.Second), fPGRestart})
	}
	// Kills of one program at least 3 s apart, so that each hits a
	// program that has been running.
	for _, k := range []string{fKillAPI, fKillRelay, fKillWorker} {
		var times []time.Duration
		for range p.KillsEach {
			t := at(0.05, 0.95)
			for range 50 {
				if !slices.ContainsFunc(times, func(u time.Duration) bool { return (t - u).Abs() < 3*time.Second }) {
					break
				}
				t = at(0.05, 0.95)
			}
			times = append(times, t)
			plan = append(plan, fault{t, k})
		}
	}
	// Targeted kills while the load still runs (a hold needs traffic).
	for range p.TargetedEach {
		plan = append(plan, fault{pick(0.05, 0.7, 5*time.Second), fRelayMark})
		plan = append(plan, fault{pick(0.05, 0.7, 5*time.Second), fWorkerCommit})
	}
	for range p.DropBursts {
		plan = append(plan, fault{at(0.05, 0.95), fDropBurst})
	}
	slices.SortStableFunc(plan, func(a, b fault) int { return int(a.At - b.At) })
	return plan
}

// chaos runs a fault plan against a system.
type chaos struct {
	s      *system
	plan   []fault
	outage time.Duration // how long NATS stays down

	mu     sync.Mutex
	events []faultEvent
	// natsDown is when the current outage began (zero while NATS runs).
	natsDown time.Time
	outages  []time.Duration // measured lengths
	backlogs []int64         // unpublished events when NATS came back
	pgOK     int             // restarts whose postmaster start time changed
}

func newChaos(s *system, plan []fault, outage time.Duration) *chaos {
	return &chaos{s: s, plan: plan, outage: outage}
}

// Run executes the plan, each action at its time after start (or as soon
// as the previous action finished). NATS is running again when it returns.
func (c *chaos) Run(ctx context.Context, start time.Time) {
	defer func() {
		if !c.s.nats.Running() {
			c.exec(context.WithoutCancel(ctx), start, fNATSStart)
		}
	}()
	for _, f := range c.plan {
		if !wait.For(ctx, time.Until(start.Add(f.At))) {
			return
		}
		c.exec(ctx, start, f.Kind)
	}
}

func (c *chaos) note(start time.Time, kind string, ok bool, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, faultEvent{At: time.Since(start), Kind: kind, OK: ok, Detail: fmt.Sprintf(format, args...)})
}

// Events returns what the actions did.
func (c *chaos) Events() []faultEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// Count returns how many actions of kind did what they are for.
func (c *chaos) Count(kind string) int {
	n := 0
	for _, e := range c.Events() {
		if e.Kind == kind && e.OK {
			n++
		}
	}
	return n
}

// killWhenHeld kills d once gate holds its connection (held fires) and
// notes the incarnation killed with heldFormat; it disarms gate and notes
// missed if nothing was held within 30 s, and disarms it when ctx ends.
func (c *chaos) killWhenHeld(ctx context.Context, start time.Time, kind string, gate *pgGate, held <-chan struct{}, d *daemon, heldFormat, missed string) {
	select {
	case <-held:
		c.s.scraper.Scrape(d)
		inc := d.Kill(time.Minute)
		c.note(start, kind, inc > 0, heldFormat, inc)
	case <-time.After(30 * time.Second):
		gate.Disarm()
		c.note(start, kind, false, "%s", missed)
	case <-ctx.Done():
		gate.Disarm()
	}
}

func (c *chaos) exec(ctx context.Context, start time.Time, kind string) {
	s := c.s
	switch kind {
	case fKillAPI, fKillRelay, fKillWorker:
		d := map[string]*daemon{fKillAPI: s.api, fKillRelay: s.relay, fKillWorker: s.worker}[kind]
		s.scraper.Scrape(d)
		inc := d.Kill(time.Minute)
		c.note(start, kind, inc > 0, "incarnation %d", inc)
	case fRelayMark:
		c.waitNATS(ctx)
		c.killWhenHeld(ctx, start, kind, s.gateRelay, s.gateRelay.HoldStatement("SET published_at"), s.relay,
			"mark of an acknowledged batch held, incarnation %d killed", "no batch was marked within 30s")
	case fWorkerCommit:
		c.waitNATS(ctx)
		c.killWhenHeld(ctx, start, kind, s.gateWorker, s.gateWorker.HoldCommitReply(), s.worker,
			"COMMIT reply held, incarnation %d killed", "no transaction committed within 30s")
	case fNATSStop:
		if !s.nats.Running() {
			return
		}
		err := s.nats.Stop(30 * time.Second)
		c.mu.Lock()
		c.natsDown = time.Now()
		c.mu.Unlock()
		c.note(start, kind, err == nil, "SIGTERM, store kept: %v", err)
	case fNATSStart:
		c.mu.Lock()
		down := c.natsDown
		c.mu.Unlock()
		// At least the planned outage, however long the stop took.
		if !down.IsZero() {
			wait.For(ctx, time.Until(down.Add(c.outage)))
		}
		backlog := c.unpublished(ctx)
		err := s.nats.Start(context.WithoutCancel(ctx))
		out := time.Since(down)
		c.mu.Lock()
		if !down.IsZero() && err == nil {
			c.outages = append(c.outages, out)
			c.backlogs = append(c.backlogs, backlog)
		}
		c.natsDown = time.Time{}
		c.mu.Unlock()
		c.note(start, kind, err == nil, "after %.1fs down; %d events waited in the outbox: %v", out.Seconds(), backlog, err)
	case fPGRestart:
		before, _ := s.pg.StartTime(ctx)
		t0 := time.Now()
		err := s.pg.Restart(ctx)
		took := time.Since(t0)
		var after time.Time
		for range 20 {
			if after, _ = s.pg.StartTime(ctx); !after.IsZero() {
				break
			}
			wait.For(ctx, 250*time.Millisecond)
		}
		ok := err == nil && after.After(before)
		if ok {
			c.mu.Lock()
			c.pgOK++
			c.mu.Unlock()
		}
		c.note(start, kind, ok, "pg_ctl took %.1fs; postmaster start %s → %s: %v", took.Seconds(),
			before.Format("15:04:05.000"), after.Format("15:04:05.000"), err)
	case fDropBurst:
		s.proxy.DropNext(10)
		c.note(start, kind, true, "")
	}
}

// waitNATS waits (up to a minute) until NATS runs.
func (c *chaos) waitNATS(ctx context.Context) {
	for i := 0; i < 600 && !c.s.nats.Running(); i++ {
		if !wait.For(ctx, 100*time.Millisecond) {
			return
		}
	}
}

// unpublished counts committed events not yet in the stream (-1: unknown).
func (c *chaos) unpublished(ctx context.Context) int64 { return unpublished(ctx, c.s.dbURL) }

// unpublished counts committed events not yet in the stream (-1: unknown).
func unpublished(ctx context.Context, dbURL string) int64 {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, dbURL)
	if err != nil {
		return -1
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int64
	if err := conn.QueryRow(qctx, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL").Scan(&n); err != nil {
		return -1
	}
	return n
}

// planSummary renders the plan compactly for the log.
func planSummary(plan []fault) string {
	var b strings.Builder
	for i, f := range plan {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%.0fs %s", f.At.Seconds(), f.Kind)
	}
	return b.String()
}
