package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/faultproxy"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/wait"
)

// Names the programs run with.
const (
	streamName    = "QUILL_EVENTS"
	subjectPrefix = "quill"
	consumerName  = "attachment-worker"
)

// system is everything a run starts. api, relay and worker are the first
// daemon of each program (the ones TestFaults' chaos kills and gates);
// apis, relays and workers are all of them.
type system struct {
	bins                  binaries
	dir                   string
	pg                    *pgCluster
	standby               *pgCluster        // the synchronous standby of topology.Standby; nil otherwise
	nats                  *natsServer       // the single server; nil with a cluster
	cluster               *natstest.Cluster // the three-node cluster; nil with a single server
	natsURL               string            // what every process is given as NATS_URL
	dbURL                 string
	api, relay, worker    *daemon
	apis, relays, workers []*daemon
	apiURL                string // the first API, directly
	gateRelay, gateWorker *pgGate
	proxy                 *faultproxy.Proxy   // the first API's
	proxies               []*faultproxy.Proxy // one in front of each API
	scraper               *scraper
	tenants               []tenant
	// webhookKey is QUILL_WEBHOOK_SECRET_KEY of every API (the webhook
	// tests give it to their dispatchers); common is every daemon's
	// environment before its own settings.
	webhookKey string
	common     []string
}

// topology is how many of each program a run starts, and against what.
type topology struct {
	APIs, Relays, Workers int
	// Cluster: a three-node JetStream cluster on loopback (natstest) with
	// an R3 stream, instead of one nats-server process.
	Cluster bool
	// Standby: PostgreSQL is a primary with a synchronous standby, and
	// every process gets both in one multi-host DATABASE_URL with
	// target_session_attrs=read-write (TestPostgresFailover); the gates
	// are left out, as they would pin one host.
	Standby bool
}

// daemons returns every daemon of the run.
func (s *system) daemons() []*daemon { return slices.Concat(s.apis, s.relays, s.workers) }

// faultRunner runs a run's faults on the test goroutine while the load
// runs; it returns when its last fault is done and every server is up.
type faultRunner interface {
	Run(ctx context.Context, start time.Time)
	Events() []faultEvent
}

// TestFaults is the fault suite: the real programs, real PostgreSQL and
// NATS, 64 clients resending through a response-dropping proxy, every
// process killed and restarted, NATS stopped for 20 s, PostgreSQL
// restarted — then every business action must have reached one explainable
// final state, and every fault must be seen to have fired.
func TestFaults(t *testing.T) {
	// Not parallel: see TestDemo.
	if testing.Short() {
		t.Skip("e2e: the fault suite runs the real programs for minutes; skipped with -short")
	}
	p, err := profileFromEnv()
	require.NoError(t, err)
	var ch *chaos
	r := runSuite(t, p, topology{APIs: 1, Relays: 1, Workers: 1}, func(s *system, _ *loadGen, rng *mrand.Rand) faultRunner {
		plan := planFaults(p, rng)
		t.Logf("fault plan: %s", planSummary(plan))
		ch = newChaos(s, plan, p.NATSOutage)
		return ch
	})
	r.s.proveFaults(t, p, ch, r.fig)
	proveEdits(t, r.fig)
	r.finish(t)
}

// suiteRun is a run after its checks: the system, still running, and its
// figures.
type suiteRun struct {
	s   *system
	fig *figures
}

// runSuite starts the system of topo, drives p's load through it while
// the runner that faults returns runs on the test goroutine (it may add
// load of its own), drains, checks
// every invariant of the final state (failing t for each violated one) and
// gathers the figures. The caller proves its faults fired, then calls
// finish.
func runSuite(t *testing.T, p profile, topo topology, faults func(*system, *loadGen, *mrand.Rand) faultRunner) *suiteRun {
	t.Helper()
	seed := randomSeed()
	if v := os.Getenv("QUILL_E2E_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "QUILL_E2E_SEED")
	}
	runID := fmt.Sprintf("%08x", uint32(seed))
	rng := mrand.New(mrand.NewPCG(seed, 42))
	t.Logf("profile %s: %d operations, %d clients, %.1f/s (~%.0fs of load); %d api, %d relay, %d worker; seed %d (QUILL_E2E_SEED=%d reproduces the plan)",
		p.Name, p.Ops, p.Clients, p.Rate, p.Duration().Seconds(), topo.APIs, topo.Relays, topo.Workers, seed, seed)
	began := time.Now()

	s := setup(t, p, seed, runID, topo)
	ctx := t.Context()
	if deadline, ok := t.Deadline(); ok {
		need := p.Duration() + 2*time.Minute
		if left := time.Until(deadline); left < need {
			t.Fatalf("e2e: %s left of go test -timeout, the %s profile needs about %s: raise -timeout", left.Round(time.Second), p.Name, need)
		}
	}

	// Metrics, scraped all along.
	sctx, stopScrape := context.WithCancel(ctx)
	scraped := make(chan struct{})
	go func() { defer close(scraped); s.scraper.Run(sctx, 250*time.Millisecond) }()
	defer func() {
		stopScrape()
		<-scraped
	}()

	// Load, and meanwhile the faults.
	lg := newLoadGen(s.proxyURLs(t), s.tenants, runID, seed, p)
	fr := faults(s, lg, rng)
	loadStart := time.Now()
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); lg.Run(ctx) }()
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		for {
			select {
			case <-stopProgress:
				return
			case <-time.After(15 * time.Second):
				t.Logf("%5.0fs: %d/%d operations started, %d requests, %d faults done, %s",
					time.Since(loadStart).Seconds(), lg.Done(), p.Ops, lg.stats.requests.Load(), len(fr.Events()), s.natsState())
			}
		}
	}()
	fr.Run(ctx, loadStart)
	faultsTook := time.Since(loadStart)
	<-loadDone
	loadTook := time.Since(loadStart)
	close(stopProgress)
	<-progressDone
	require.NoError(t, ctx.Err())
	t.Logf("load done in %.1fs; faults done at %.1fs", loadTook.Seconds(), faultsTook.Seconds())
	for _, e := range fr.Events() {
		t.Logf("  fault %6.1fs %-38s ok=%-5t %s", e.At.Seconds(), e.Kind, e.OK, e.Detail)
	}

	// Drain: everything committed must reach its final state.
	for _, px := range s.proxies {
		require.NoError(t, px.SetDropProbability(0))
		px.DropNext(0)
	}
	drainStart := time.Now()
	require.NoError(t, s.drain(ctx, t, p.DrainTimeout), "drain")
	drainTook := time.Since(drainStart)
	t.Logf("drained in %.1fs", drainTook.Seconds())
	// The final counters, before the lookups add requests of their own.
	stopScrape()
	<-scraped
	for _, d := range s.daemons() {
		s.scraper.Scrape(d)
	}

	// The final state.
	ops := lg.Ops()
	st, err := loadState(ctx, s.dbURL, consumerName)
	require.NoError(t, err)
	st.stream, err = readStream(ctx, s.natsURL, streamName)
	require.NoError(t, err, "read the stream")
	st.lookups = lookupAll(ctx, s.apiURL, ops)
	v := newVerdict()
	_, tally := checkAll(v, ops, st, consumerName, subjectPrefix)
	v.Report(t)

	fig := s.figures(ctx, t, p, fr, lg, st, tally)
	fig.duration, fig.load, fig.drain = time.Since(began), loadTook, drainTook
	return &suiteRun{s: s, fig: fig}
}

// finish runs `api audit`, stops every program with SIGTERM (each must
// exit 0), and prints the report (and the logs' failures when t failed).
func (r *suiteRun) finish(t *testing.T) {
	t.Helper()
	s := r.s
	s.audit(t.Context(), t)

	// SIGTERM: each program finishes its work and exits 0 (SPEC §1).
	for _, d := range s.daemons() {
		if e := d.Stop(40 * time.Second); e != nil && e.Status != "exit status 0" {
			t.Errorf("PRODUCT: %s did not exit 0 on SIGTERM: %s after %s (see %s)", d.name, e.Status, e.Uptime.Round(time.Millisecond), d.logFile)
		}
	}

	report := r.fig.String()
	t.Log("\n" + report)
	if path := os.Getenv("QUILL_E2E_REPORT"); path != "" {
		_ = os.WriteFile(path, []byte(report), 0o644)
	}
	if t.Failed() {
		s.dumpLogs(t)
	}
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// setup builds the programs, starts PostgreSQL, NATS (one server, or the
// cluster), the gates, the daemons of topo and a proxy in front of each
// API, and creates the database and two tenants' tokens. The relays start
// first and the workers only once the stream exists as the relays
// provision it: a worker that found no stream would create one itself.
func setup(t *testing.T, p profile, seed uint64, runID string, topo topology) *system {
	t.Helper()
	dir := os.Getenv("QUILL_E2E_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else {
		dir = filepath.Join(dir, "run-"+runID)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		t.Logf("artifacts (logs, NATS store) in %s", dir)
	}
	s := &system{dir: dir}
	s.bins = buildBinaries(t, filepath.Join(dir, "bin"))
	s.pg = startPostgres(t)
	replicas := 1
	if topo.Cluster {
		replicas = 3
		s.cluster = natstest.StartCluster(t, 3)
		s.natsURL = s.cluster.URLs()
		t.Logf("JetStream cluster of 3 nodes: %s; meta leader n%d", s.natsURL, s.cluster.MetaLeader())
	} else {
		s.nats = startNATS(t, s.bins.nats, dir)
		s.natsURL = s.nats.URL()
	}
	db := "quill_e2e_" + runID
	s.dbURL = s.pg.URL(db)
	if topo.Standby {
		s.standby = startStandby(t, s.pg)
		s.dbURL = multiHostURL(db, s.pg, s.standby)
		t.Logf("PostgreSQL: primary on :%d, synchronous standby on :%d; DATABASE_URL %s", s.pg.port, s.standby.port, s.dbURL)
	}

	base := cleanEnv()
	// api migrate creates the database.
	runOK(t, s.bins.api, slices.Concat(base, []string{"DATABASE_URL=" + s.dbURL}), "migrate")
	for _, name := range []string{"e2e-a", "e2e-b"} {
		out := runOK(t, s.bins.api, slices.Concat(base, []string{"DATABASE_URL=" + s.dbURL}), "token", "create", "--tenant", name)
		s.tenants = append(s.tenants, tenant{Name: name, Token: strings.TrimSpace(out)})
	}

	pgAddr := fmt.Sprintf("127.0.0.1:%d", s.pg.port)
	s.gateRelay, s.gateWorker = newPGGate(t, pgAddr), newPGGate(t, pgAddr)
	viaGate := func(g *pgGate) string {
		if topo.Standby {
			return s.dbURL
		}
		u, _ := url.Parse(s.dbURL)
		u.Host = g.Addr()
		return u.String()
	}
	admin := func() string { return fmt.Sprintf("127.0.0.1:%d", freePort(t)) }
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	s.webhookKey = base64.StdEncoding.EncodeToString(key)
	common := slices.Concat(base, []string{"NATS_URL=" + s.natsURL, "QUILL_STREAM=" + streamName,
		"QUILL_SUBJECT_PREFIX=" + subjectPrefix, "QUILL_LOG_LEVEL=info",
		// The webhook tests' receivers listen on loopback, which only
		// QUILL_WEBHOOK_ALLOW_PRIVATE lets the API register.
		"QUILL_WEBHOOK_SECRET_KEY=" + s.webhookKey, "QUILL_WEBHOOK_ALLOW_PRIVATE=true"})
	s.common = common
	env := func(extra ...string) []string { return slices.Concat(common, extra) }
	// The first daemon of a program is named after it, the others get a
	// number: relay, relay-2.
	name := func(role string, i int) string {
		if i == 0 {
			return role
		}
		return fmt.Sprintf("%s-%d", role, i+1)
	}
	add := func(role string, i int, extra []string, args ...string) *daemon {
		adminAddr := admin()
		n := name(role, i)
		d := newDaemon(n, map[string]string{"api": s.bins.api, "relay": s.bins.relay, "attachment-worker": s.bins.worker}[role],
			adminAddr, filepath.Join(dir, n+".log"), env(append(extra, "QUILL_ADMIN_ADDR="+adminAddr)...), args...)
		d.role = role
		return d
	}
	var apiURLs []string
	for i := range topo.APIs {
		httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		apiURLs = append(apiURLs, "http://"+httpAddr)
		s.apis = append(s.apis, add("api", i, []string{"DATABASE_URL=" + s.dbURL, "QUILL_HTTP_ADDR=" + httpAddr}, "serve"))
	}
	s.apiURL = apiURLs[0]
	for i := range topo.Relays {
		// The first relay reaches PostgreSQL through its gate (the chaos
		// holds a mark there). Its timings are the fixed ones: a NATS
		// outage's backlog is taken up within its backoff cap (30 s) of
		// NATS coming back, inside the 30 s a targeted kill waits for a
		// mark after the 5 s margin it keeps from an outage; a killed
		// relay's claims end with its session.
		db := s.dbURL
		if i == 0 {
			db = viaGate(s.gateRelay)
		}
		extra := []string{"DATABASE_URL=" + db}
		if topo.Cluster {
			extra = append(extra, fmt.Sprintf("QUILL_STREAM_REPLICAS=%d", replicas))
		}
		s.relays = append(s.relays, add("relay", i, extra, "run"))
	}
	for i := range topo.Workers {
		db := s.dbURL
		if i == 0 {
			db = viaGate(s.gateWorker)
		}
		// A short ack wait, so that a killed worker's messages come back soon.
		s.workers = append(s.workers, add("attachment-worker", i,
			[]string{"DATABASE_URL=" + db, "QUILL_CONSUMER=" + consumerName, "QUILL_ACK_WAIT=5s"}, "run"))
	}
	s.api, s.relay, s.worker = s.apis[0], s.relays[0], s.workers[0]
	start := func(ds []*daemon) {
		for _, d := range ds {
			go d.Run()
			t.Cleanup(func() { _ = d.Stop(40 * time.Second) })
		}
		for _, d := range ds {
			require.NoError(t, d.WaitHealthy(t.Context(), 90*time.Second))
		}
	}
	start(slices.Concat(s.apis, s.relays))
	require.NoError(t, waitForStream(t.Context(), s.natsURL, streamName, replicas, 90*time.Second),
		"the stream as the relays provision it, before the workers start")
	start(s.workers)
	s.scraper = newScraper(s.daemons()...)

	for i, au := range apiURLs {
		u, _ := url.Parse(au)
		px, err := faultproxy.New(faultproxy.Config{
			Upstream:        u,
			DropProbability: p.DropProbability,
			Eligible: func(r *http.Request) bool {
				return r.Method == http.MethodPost || r.Method == http.MethodPatch || r.Method == http.MethodDelete
			},
			Seed: seed + uint64(i),
		})
		require.NoError(t, err)
		t.Cleanup(px.Close)
		s.proxies = append(s.proxies, px)
	}
	s.proxy = s.proxies[0]
	return s
}

// jetStreamAt connects to natsURL under the connection name name, with
// opts; the caller closes the connection.
func jetStreamAt(natsURL, name string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(natsURL, append([]nats.Option{nats.Name(name)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// waitForStream waits until stream exists with replicas replicas, all of
// them current (a cluster's followers caught up with its leader).
func waitForStream(ctx context.Context, natsURL, stream string, replicas int, timeout time.Duration) error {
	nc, js, err := jetStreamAt(natsURL, "e2e-stream-wait", nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := js.Stream(cctx, stream)
		cancel()
		if err != nil {
			last = err.Error()
		} else {
			info := st.CachedInfo()
			current := 1
			if info.Cluster != nil {
				for _, r := range info.Cluster.Replicas {
					if r.Current && !r.Offline {
						current++
					}
				}
			}
			if info.Config.Replicas == replicas && current == replicas && (replicas == 1 || info.Cluster.Leader != "") {
				return nil
			}
			last = fmt.Sprintf("replicas %d, %d current", info.Config.Replicas, current)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stream %s not at %d current replicas within %s: %s", stream, replicas, timeout, last)
		}
		if !wait.For(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// natsState says whether NATS is up, for the progress lines.
func (s *system) natsState() string {
	if s.cluster != nil {
		up := 0
		for _, ns := range s.cluster.Servers() {
			if ns != nil {
				up++
			}
		}
		return fmt.Sprintf("nats nodes up %d/3", up)
	}
	return fmt.Sprintf("nats up %t", s.nats.Running())
}

// proxyURLs serves each API's proxy for the rest of the test.
func (s *system) proxyURLs(t *testing.T) []string {
	var urls []string
	for _, px := range s.proxies {
		srv := httptest.NewServer(px)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return urls
}

// runOK runs a program to completion and returns its stdout.
func runOK(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "%s %s: %s", filepath.Base(bin), strings.Join(args, " "), errb.String())
	return out.String()
}

// drain waits until the system settled: NATS and every program up, no
// unpublished event, every note.created with an attachment through the
// worker's inbox, and nothing pending or unacknowledged on the consumer.
func (s *system) drain(ctx context.Context, t *testing.T, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if s.nats != nil && !s.nats.Running() {
		if err := s.nats.Start(ctx); err != nil {
			return err
		}
	}
	for _, d := range s.daemons() {
		if err := d.WaitHealthy(ctx, time.Until(deadline)); err != nil {
			return err
		}
	}
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	nc, js, err := jetStreamAt(s.natsURL, "e2e-drain", nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	lastLog := time.Now()
	for {
		var unpublished, parked, waiting int64
		err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL)
			FROM outbox_events`).Scan(&unpublished, &parked)
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM outbox_events e JOIN attachments a ON a.note_id = e.aggregate_id
				WHERE e.type = 'note.created' AND NOT EXISTS (SELECT 1 FROM quill_consumer_inbox i WHERE i.consumer = $1 AND i.event_id = e.id)`,
				consumerName).Scan(&waiting)
		}
		if err != nil {
			return fmt.Errorf("drain query: %w", err)
		}
		if parked > 0 {
			return fmt.Errorf("%d events are parked: they can never be published as they are (relay events list --parked)", parked)
		}
		var pending, ackPending uint64 = 1, 1
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if c, err := js.Consumer(cctx, streamName, consumerName); err == nil {
			if ci, err := c.Info(cctx); err == nil {
				pending, ackPending = ci.NumPending, uint64(ci.NumAckPending)
			}
		}
		cancel()
		if unpublished == 0 && waiting == 0 && pending == 0 && ackPending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after %s: %d unpublished events, %d attachments waiting for the worker, consumer pending %d, unacknowledged %d",
				timeout, unpublished, waiting, pending, ackPending)
		}
		if time.Since(lastLog) > 10*time.Second {
			t.Logf("draining: %d unpublished events, %d attachments waiting, consumer pending %d, unacknowledged %d",
				unpublished, waiting, pending, ackPending)
			lastLog = time.Now()
		}
		if !wait.For(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// audit runs `api audit --json`, which must exit 0; until the command
// exists the step is skipped with a note.
func (s *system) audit(ctx context.Context, t *testing.T) {
	env := slices.Concat(cleanEnv(), []string{"DATABASE_URL=" + s.dbURL, "NATS_URL=" + s.natsURL, "QUILL_STREAM=" + streamName,
		"QUILL_SUBJECT_PREFIX=" + subjectPrefix, "QUILL_CONSUMER=" + consumerName, "QUILL_LOG_LEVEL=warn"})
	run := func(args ...string) (string, string, int) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, s.bins.api, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		return out.String(), errb.String(), code
	}
	// The audit itself starts its stream scan over on a cluster's
	// ordered-consumer race (internal/audit); no rerun here.
	stdout, stderr, code := run("audit", "--json")
	var rep struct {
		Anomalies []map[string]any `json:"anomalies"`
		Counts    map[string]any   `json:"counts"`
		Chains    []struct {
			Tenant, Key, Action string
		} `json:"chains"`
	}
	jerr := json.Unmarshal([]byte(stdout), &rep)
	switch {
	case code != 0:
		actions := map[string]string{}
		for _, c := range rep.Chains {
			actions[c.Tenant+"/"+c.Key] = c.Action
		}
		t.Errorf("api audit --json exited %d; anomalies by kind and action: %s\nanomalies %v\nstdout: %s\nstderr: %s",
			code, anomalySummary(rep.Anomalies, actions), trimTo(fmt.Sprint(rep.Anomalies), 4000), trimTo(stdout, 4000), trimTo(stderr, 2000))
	case jerr != nil:
		t.Errorf("api audit --json: stdout is not the JSON report: %v\n%s", jerr, trimTo(stdout, 2000))
	default:
		t.Logf("api audit --json: exit 0, %d anomalies, counts %v", len(rep.Anomalies), rep.Counts)
	}
}

// anomalySummary counts an audit's anomalies by kind and by the action of
// the operation each names (its chain's), with a key of each.
func anomalySummary(anomalies []map[string]any, actions map[string]string) string {
	type group struct {
		n   int
		key string
	}
	groups := map[string]*group{}
	for _, a := range anomalies {
		tenant, _ := a["tenant"].(string)
		key, _ := a["key"].(string)
		action := actions[tenant+"/"+key]
		if action == "" {
			action = "no action"
		}
		name := fmt.Sprintf("%v (%s)", a["kind"], action)
		if groups[name] == nil {
			groups[name] = &group{key: key}
		}
		groups[name].n++
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(groups)) {
		out = append(out, fmt.Sprintf("%s: %d, e.g. key %q", name, groups[name].n, groups[name].key))
	}
	return strings.Join(out, "; ")
}

func trimTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// dumpLogs prints the end of every log and the lines that look like
// failures, for a failed run.
func (s *system) dumpLogs(t *testing.T) {
	for _, d := range s.daemons() {
		t.Logf("--- %s log, warnings and errors (first 30):\n%s", d.name,
			strings.Join(grepFile(d.logFile, 30, `"level":"error"`, `"level":"warn"`, "panic", "=== e2e"), "\n"))
		t.Logf("--- %s log, last 20 lines:\n%s", d.name, tail(d.logFile, 20))
	}
	if s.nats != nil {
		t.Logf("--- nats-server log, last 20 lines:\n%s", tail(s.nats.logFile, 20))
	}
	t.Logf("--- postgres log, last 20 lines:\n%s", tail(s.pg.logFile, 20))
	if s.standby != nil {
		t.Logf("--- postgres standby log, last 20 lines:\n%s", tail(s.standby.logFile, 20))
	}
	if os.Getenv("QUILL_E2E_ARTIFACTS") == "" {
		t.Logf("set QUILL_E2E_ARTIFACTS=DIR to keep the whole logs and the NATS store")
	}
}
