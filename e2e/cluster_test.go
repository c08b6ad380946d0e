package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/wait"
)

// Fault kinds of the cluster run.
const (
	fStreamLeaderStop = "shut the stream leader down"
	fMetaStepDown     = "step the meta leader down"
	fNodeStop         = "stop one node"
)

// clusterReplicas is the stream's replicas in the cluster run.
const clusterReplicas = 3

// TestClusterFaults is the fault suite against a three-node JetStream
// cluster with an R3 stream, two APIs, two relays and two workers: the
// load of TestFaults (64 clients resending through response-dropping
// proxies), and meanwhile, in each cycle, the stream leader shut down and
// started again, the meta leader stepped down and one node stopped for
// 20 s. The final state must pass every check of TestFaults and `api
// audit`, and the faults must be seen to have fired: the leaders changed,
// the relays saw publish errors and retried.
func TestClusterFaults(t *testing.T) {
	// Not parallel: see TestDemo.
	if testing.Short() {
		t.Skip("e2e: the cluster fault suite runs the real programs for minutes; skipped with -short")
	}
	p, err := clusterProfileFromEnv()
	require.NoError(t, err)
	var ch *clusterChaos
	r := runSuite(t, p, topology{APIs: 2, Relays: 2, Workers: 2, Cluster: true}, func(s *system, lg *loadGen, rng *mrand.Rand) faultRunner {
		ch = newClusterChaos(t, s, lg, p, rng)
		t.Logf("fault plan: %d cycle(s) of: stream leader shut down for %s at 12 %%, meta leader step-down at 35 %%, one node stopped for %s at 45 %% of the cycle (%s each)",
			max(1, p.ClusterCycles), p.LeaderOutage, p.NodeOutage, (p.Duration() / time.Duration(max(1, p.ClusterCycles))).Round(time.Second))
		return ch
	})
	r.s.proveClusterFaults(t, p, r.fig)
	proveEdits(t, r.fig)
	r.finish(t)
}

// leaderChange is one change of a leader the run caused.
type leaderChange struct {
	Before, After int           // node indexes
	Down          time.Duration // how long the old leader was shut down (0: a step-down)
	Elected       time.Duration // from the fault until another node led
}

// nodeOutage is one node stopped and started again.
type nodeOutage struct {
	Node                   int
	Roles                  string // what it was when stopped
	Clients                string // the quill connections it served
	Down                   time.Duration
	LeaderBefore, LeaderIn int // the stream's leader before and during the outage
}

// clusterChaos runs the cluster faults. It runs on the test goroutine:
// natstest's waits fail the test when the cluster does not recover.
type clusterChaos struct {
	t   *testing.T
	s   *system
	lg  *loadGen
	p   profile
	rng *mrand.Rand
	js  jetstream.JetStream

	bursts []<-chan struct{} // the bursts' done channels

	mu            sync.Mutex
	events        []faultEvent
	streamLeaders []leaderChange
	metaLeaders   []leaderChange
	nodeOutages   []nodeOutage
}

func newClusterChaos(t *testing.T, s *system, lg *loadGen, p profile, rng *mrand.Rand) *clusterChaos {
	_, js := s.cluster.Connect(t)
	return &clusterChaos{t: t, s: s, lg: lg, p: p, rng: rng, js: js}
}

// burstWorkers is how many of a burst's creates run at once: 16 per tenant,
// 8 per tenant and API, well under QUILL_TENANT_CONCURRENCY.
const burstWorkers = 32

// busy starts a burst of BurstOps creates and returns once it is in full
// swing (a third of it begun), with the outbox's backlog then. The faults
// are graceful — a stream leader that shuts down hands its leadership over
// at once, a client whose node stops reconnects to another within
// milliseconds — so they can only make a publish fail while one is in
// flight, and at the schedule's rate a relay has one in flight a few per
// cent of the time: the burst keeps both relays publishing while the
// fault strikes.
func (c *clusterChaos) busy(ctx context.Context) int64 {
	if c.p.BurstOps == 0 {
		return -1
	}
	started, done := c.lg.Burst(ctx, c.p.BurstOps, burstWorkers)
	c.bursts = append(c.bursts, done)
	for started.Load() < int64(c.p.BurstOps/3) {
		select {
		case <-done:
			return unpublished(ctx, c.s.dbURL)
		case <-ctx.Done():
			return -1
		case <-time.After(10 * time.Millisecond):
		}
	}
	return unpublished(ctx, c.s.dbURL)
}

// Run runs the cycles, each spread over its share of the load. Between
// faults it waits until the stream's replicas are current again, so that
// no fault takes a second node of a stream that has not caught up (two of
// three down is an outage, not a fault this test plans).
func (c *clusterChaos) Run(ctx context.Context, start time.Time) {
	cycles := max(1, c.p.ClusterCycles)
	span := c.p.Duration() / time.Duration(cycles)
	for i := range cycles {
		at := func(frac float64) time.Duration {
			return time.Until(start.Add(time.Duration(i)*span + time.Duration(frac*float64(span))))
		}
		if !wait.For(ctx, at(0.12)) {
			return
		}
		c.stopStreamLeader(ctx, start)
		if !wait.For(ctx, at(0.35)) {
			return
		}
		c.stepDownMeta(start)
		if !wait.For(ctx, at(0.45)) {
			return
		}
		c.stopNode(ctx, start)
	}
	for _, done := range c.bursts {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
}

// note records a fault that began at began.
func (c *clusterChaos) note(start, began time.Time, kind string, ok bool, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, faultEvent{At: began.Sub(start), Kind: kind, OK: ok, Detail: fmt.Sprintf(format, args...)})
}

// clients returns, per client name (quill-relay, quill-attachment-worker,
// …), how many connections node i serves; "" when it is down.
func (c *clusterChaos) clients(i int) string {
	ns := c.s.cluster.Servers()[i]
	if ns == nil {
		return ""
	}
	cz, err := ns.Connz(&server.ConnzOptions{Limit: 4096})
	if err != nil {
		return err.Error()
	}
	count := map[string]int{}
	for _, ci := range cz.Conns {
		if strings.HasPrefix(ci.Name, "quill-") {
			count[ci.Name]++
		}
	}
	var out []string
	for name, n := range count {
		out = append(out, fmt.Sprintf("%d %s", n, name))
	}
	sort.Strings(out)
	if len(out) == 0 {
		return "no quill clients"
	}
	return strings.Join(out, ", ")
}

// Events returns what the faults did.
func (c *clusterChaos) Events() []faultEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// stopStreamLeader shuts the stream's leader down, waits until another
// node leads the stream, keeps the old leader down for LeaderOutage and
// starts it again.
func (c *clusterChaos) stopStreamLeader(ctx context.Context, start time.Time) {
	cl := c.s.cluster
	before := cl.StreamLeader(c.t, streamName)
	wasMeta := cl.MetaLeader() == before
	clients := c.clients(before)
	backlog := c.busy(ctx)
	t0 := time.Now()
	cl.Stop(before)
	after := cl.StreamLeader(c.t, streamName)
	elected := time.Since(t0)
	down := c.restartAfter(ctx, before, t0, c.p.LeaderOutage)
	c.mu.Lock()
	c.streamLeaders = append(c.streamLeaders, leaderChange{Before: before, After: after, Down: down, Elected: elected})
	c.mu.Unlock()
	c.note(start, t0, fStreamLeaderStop, after != before,
		"stream leader n%d (meta leader too: %t; serving %s) shut down during a burst (%d events unpublished); n%d led after %.1fs; n%d started again after %.1fs, replicas current at %.1fs",
		before, wasMeta, clients, backlog, after, elected.Seconds(), before, down.Seconds(), time.Since(t0).Seconds())
}

// restartAfter keeps node n, stopped at t0, down until outage has passed,
// starts it again and waits until the stream's replicas and the workers'
// consumer are current, before the next fault; it returns how long the
// node was down.
func (c *clusterChaos) restartAfter(ctx context.Context, n int, t0 time.Time, outage time.Duration) time.Duration {
	cl := c.s.cluster
	wait.For(ctx, time.Until(t0.Add(outage)))
	down := time.Since(t0)
	cl.Restart(c.t, n)
	cl.WaitForStreamReplicas(c.t, c.js, streamName, clusterReplicas)
	cl.WaitHealthy(c.t)
	return down
}

// stepDownMeta asks the meta leader to step down, as an operator would.
func (c *clusterChaos) stepDownMeta(start time.Time) {
	cl := c.s.cluster
	before := cl.WaitForLeader(c.t)
	t0 := time.Now()
	after := cl.StepDownMetaLeader(c.t)
	elected := time.Since(t0)
	c.mu.Lock()
	c.metaLeaders = append(c.metaLeaders, leaderChange{Before: before, After: after, Elected: elected})
	c.mu.Unlock()
	c.note(start, t0, fMetaStepDown, after != before, "meta leader n%d stepped down; n%d led after %.1fs", before, after, elected.Seconds())
}

// stopNode stops one node for NodeOutage: chosen by the seed among those
// that serve a relay's connection (so that a relay must reconnect to
// another node and sees its publishes fail meanwhile), whatever else it
// is then (the stream leader, the meta leader or a follower).
func (c *clusterChaos) stopNode(ctx context.Context, start time.Time) {
	cl := c.s.cluster
	var withRelay []int
	for i := range clusterReplicas {
		if strings.Contains(c.clients(i), "quill-relay") {
			withRelay = append(withRelay, i)
		}
	}
	n := c.rng.IntN(clusterReplicas)
	if len(withRelay) > 0 {
		n = withRelay[c.rng.IntN(len(withRelay))]
	}
	clients := c.clients(n)
	leader, meta := cl.StreamLeader(c.t, streamName), cl.MetaLeader()
	backlog := c.busy(ctx)
	var roles []string
	if n == leader {
		roles = append(roles, "stream leader")
	}
	if n == meta {
		roles = append(roles, "meta leader")
	}
	if len(roles) == 0 {
		roles = append(roles, "follower")
	}
	t0 := time.Now()
	cl.Stop(n)
	during := cl.StreamLeader(c.t, streamName)
	down := c.restartAfter(ctx, n, t0, c.p.NodeOutage)
	c.mu.Lock()
	c.nodeOutages = append(c.nodeOutages, nodeOutage{Node: n, Roles: strings.Join(roles, ", "), Clients: clients, Down: down, LeaderBefore: leader, LeaderIn: during})
	c.mu.Unlock()
	c.note(start, t0, fNodeStop, down >= c.p.NodeOutage, "n%d (%s; serving %s) stopped during a burst (%d events unpublished) for %.1fs; stream leader n%d before, n%d during; replicas current at %.1fs",
		n, strings.Join(roles, ", "), clients, backlog, down.Seconds(), leader, during, time.Since(t0).Seconds())
}

// clusterFigures are the cluster run's faults and the stream at the end.
type clusterFigures struct {
	streamLeaders, metaLeaders []leaderChange
	nodeOutages                []nodeOutage
	replicas, current          int    // the stream's at the end
	leader                     string // the stream's leader at the end (server name)
	metaLeader                 int
	infoErr                    error
	relayRetries               map[string]int // relay → "relay pass failed; backing off" lines
	relayCategories            []string       // their errors' causes
}

func (c *clusterChaos) figures(ctx context.Context, s *system) *clusterFigures {
	c.mu.Lock()
	f := &clusterFigures{streamLeaders: slices.Clone(c.streamLeaders), metaLeaders: slices.Clone(c.metaLeaders),
		nodeOutages: slices.Clone(c.nodeOutages), relayRetries: map[string]int{}}
	c.mu.Unlock()
	f.metaLeader = s.cluster.MetaLeader()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if st, err := c.js.Stream(cctx, streamName); err != nil {
		f.infoErr = err
	} else {
		info := st.CachedInfo()
		f.replicas = info.Config.Replicas
		if info.Cluster != nil {
			f.leader = info.Cluster.Leader
			for _, r := range info.Cluster.Replicas {
				if r.Current && !r.Offline {
					f.current++
				}
			}
		}
	}
	cats := map[string]bool{}
	for _, d := range s.relays {
		n, cs := retriesInLog(d.logFile)
		f.relayRetries[d.name] = n
		for _, c := range cs {
			cats[c] = true
		}
	}
	for c := range cats {
		f.relayCategories = append(f.relayCategories, c)
	}
	sort.Strings(f.relayCategories)
	return f
}

// retriesInLog counts a relay's "relay pass failed; backing off" lines and
// returns their errors' causes (the text after the last colon: "nats:
// timeout waiting for ack", "nats: server is disconnected", …).
func retriesInLog(path string) (int, []string) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil
	}
	defer f.Close()
	n, cats := 0, map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Message string `json:"message"`
			Error   string `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Message != "relay pass failed; backing off" {
			continue
		}
		n++
		cause := line.Error
		if i := strings.LastIndex(cause, ": nats: "); i >= 0 {
			cause = cause[i+2:]
		} else if i := strings.LastIndex(cause, ": "); i >= 0 {
			cause = cause[i+2:]
		}
		cats[cause] = true
	}
	var out []string
	for c := range cats {
		out = append(out, c)
	}
	sort.Strings(out)
	return n, out
}

func (f *clusterFigures) write(w func(string, ...any)) {
	var sl, ml, no []string
	for _, c := range f.streamLeaders {
		sl = append(sl, fmt.Sprintf("n%d → n%d (n%d shut down %.1fs, new leader in %.1fs)", c.Before, c.After, c.Before, c.Down.Seconds(), c.Elected.Seconds()))
	}
	for _, c := range f.metaLeaders {
		ml = append(ml, fmt.Sprintf("n%d → n%d (step-down, new leader in %.1fs)", c.Before, c.After, c.Elected.Seconds()))
	}
	for _, o := range f.nodeOutages {
		no = append(no, fmt.Sprintf("n%d (%s; serving %s) down %.1fs, stream leader n%d → n%d", o.Node, o.Roles, o.Clients, o.Down.Seconds(), o.LeaderBefore, o.LeaderIn))
	}
	w("cluster         3 nodes; at the end the stream is R%d with leader %s and %d current followers, meta leader n%d",
		f.replicas, f.leader, f.current, f.metaLeader)
	w("stream leader   %s", strings.Join(sl, "; "))
	w("meta leader     %s", strings.Join(ml, "; "))
	w("node outages    %s", strings.Join(no, "; "))
	w("relay retries   \"relay pass failed; backing off\" %s (causes: %s)", strings.Join(inKeyOrder(f.relayRetries, "%s %d"), ", "), strings.Join(f.relayCategories, "; "))
}

// proveClusterFaults fails t unless the cluster faults fired and left
// their trace: every planned leader change happened, the node outages
// lasted, the relays saw publish errors and backed off, the stream is
// still R3 — and no program crashed, responses were dropped and replayed.
func (s *system) proveClusterFaults(t *testing.T, p profile, f *figures) {
	t.Helper()
	cf := f.cluster
	require.NotNil(t, cf, "cluster figures")
	cycles := max(1, p.ClusterCycles)
	if len(cf.streamLeaders) < cycles {
		t.Errorf("FAULT not fired: the stream leader was shut down %d times, want %d", len(cf.streamLeaders), cycles)
	}
	for i, c := range cf.streamLeaders {
		if c.After == c.Before {
			t.Errorf("FAULT without effect: stream leader shut-down %d: n%d still leads", i+1, c.Before)
		}
	}
	if len(cf.metaLeaders) < cycles {
		t.Errorf("FAULT not fired: the meta leader stepped down %d times, want %d", len(cf.metaLeaders), cycles)
	}
	for i, c := range cf.metaLeaders {
		if c.After == c.Before {
			t.Errorf("FAULT without effect: meta leader step-down %d: n%d still leads", i+1, c.Before)
		}
	}
	if len(cf.nodeOutages) < cycles {
		t.Errorf("FAULT not fired: a node was stopped %d times, want %d", len(cf.nodeOutages), cycles)
	}
	for i, o := range cf.nodeOutages {
		if o.Down < p.NodeOutage {
			t.Errorf("FAULT too short: node outage %d lasted %s, want %s", i+1, o.Down, p.NodeOutage)
		}
	}
	if f.relayErrors == 0 {
		t.Errorf("FAULT not proven: no relay saw a publish error (quill_relay_publish_errors_total = 0 over %d relays)", len(s.relays))
	}
	retries := 0
	for _, n := range cf.relayRetries {
		retries += n
	}
	if retries == 0 {
		t.Errorf("FAULT not proven: no relay logged \"relay pass failed; backing off\"")
	}
	switch {
	case cf.infoErr != nil:
		t.Errorf("the stream's info at the end: %v", cf.infoErr)
	case cf.replicas != clusterReplicas || cf.current != clusterReplicas-1:
		t.Errorf("PRODUCT: the stream is R%d with %d current followers at the end, want R%d with %d (QUILL_STREAM_REPLICAS=%d)",
			cf.replicas, cf.current, clusterReplicas, clusterReplicas-1, clusterReplicas)
	}
	s.proveNoCrash(t, f)
	s.proveResends(t, f)
}
