package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/quillhq/quill/internal/wait"
)

// Names the programs run with.
const (
	streamName    = "QUILL_EVENTS"
	subjectPrefix = "quill"
	consumerName  = "attachment-worker"
)

// system is everything a run starts.
type system struct {
	bins                  binaries
	dir                   string
	pg                    *pgCluster
	nats                  *natsServer
	dbURL                 string
	api, relay, worker    *daemon
	apiURL                string
	gateRelay, gateWorker *pgGate
	proxy                 *faultproxy.Proxy
	scraper               *scraper
	tenants               []tenant
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
	seed := randomSeed()
	if v := os.Getenv("QUILL_E2E_SEED"); v != "" {
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "QUILL_E2E_SEED")
	}
	runID := fmt.Sprintf("%08x", uint32(seed))
	rng := mrand.New(mrand.NewPCG(seed, 42))
	t.Logf("profile %s: %d operations, %d clients, %.1f/s (~%.0fs of load); seed %d (QUILL_E2E_SEED=%d reproduces the plan)",
		p.Name, p.Ops, p.Clients, p.Rate, p.Duration().Seconds(), seed, seed)
	began := time.Now()

	s := setup(t, p, seed, runID)
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

	// Load and faults.
	plan := planFaults(p, rng)
	t.Logf("fault plan: %s", planSummary(plan))
	ch := newChaos(s, plan, p.NATSOutage)
	lg := newLoadGen(s.proxyURL(t), s.tenants, runID, seed, p)
	loadStart := time.Now()
	chaosDone := make(chan struct{})
	go func() { defer close(chaosDone); ch.Run(ctx, loadStart) }()
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		for {
			select {
			case <-stopProgress:
				return
			case <-time.After(15 * time.Second):
				t.Logf("%5.0fs: %d/%d operations started, %d requests, %d faults done, nats up %t",
					time.Since(loadStart).Seconds(), lg.Done(), p.Ops, lg.stats.requests.Load(), len(ch.Events()), s.nats.Running())
			}
		}
	}()
	lg.Run(ctx)
	loadTook := time.Since(loadStart)
	<-chaosDone
	close(stopProgress)
	<-progressDone
	require.NoError(t, ctx.Err())
	t.Logf("load done in %.1fs; faults done at %.1fs", loadTook.Seconds(), time.Since(loadStart).Seconds())
	for _, e := range ch.Events() {
		t.Logf("  fault %6.1fs %-38s ok=%-5t %s", e.At.Seconds(), e.Kind, e.OK, e.Detail)
	}

	// Drain: everything committed must reach its final state.
	require.NoError(t, s.proxy.SetDropProbability(0))
	s.proxy.DropNext(0)
	drainStart := time.Now()
	require.NoError(t, s.drain(ctx, t, p.DrainTimeout), "drain")
	drainTook := time.Since(drainStart)
	t.Logf("drained in %.1fs", drainTook.Seconds())
	// The final counters, before the lookups add requests of their own.
	stopScrape()
	<-scraped
	for _, d := range []*daemon{s.api, s.relay, s.worker} {
		s.scraper.Scrape(d)
	}

	// The final state.
	ops := lg.Ops()
	st, err := loadState(ctx, s.dbURL, consumerName)
	require.NoError(t, err)
	st.stream, err = readStream(ctx, s.nats.URL(), streamName)
	require.NoError(t, err, "read the stream")
	st.lookups = lookupAll(ctx, s.apiURL, ops)
	v := newVerdict()
	_, tally := checkAll(v, ops, st, consumerName, subjectPrefix)
	v.Report(t)

	// The faults fired.
	fig := s.figures(ctx, t, p, ch, lg, st, tally)
	fig.duration, fig.load, fig.drain = time.Since(began), loadTook, drainTook
	s.proveFaults(t, p, ch, fig)

	// api audit, when the build has it.
	s.audit(ctx, t)

	// SIGTERM: each program finishes its work and exits 0 (SPEC §1).
	for _, d := range []*daemon{s.api, s.relay, s.worker} {
		if e := d.Stop(40 * time.Second); e != nil && e.Status != "exit status 0" {
			t.Errorf("PRODUCT: %s did not exit 0 on SIGTERM: %s after %s (see %s)", d.name, e.Status, e.Uptime.Round(time.Millisecond), d.logFile)
		}
	}

	report := fig.String()
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

// setup builds the programs, starts PostgreSQL, NATS, the gates, the three
// daemons and the proxy, and creates the database and two tenants' tokens.
func setup(t *testing.T, p profile, seed uint64, runID string) *system {
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
	s.nats = startNATS(t, s.bins.nats, dir)
	db := "quill_e2e_" + runID
	s.dbURL = s.pg.URL(db)

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
		u, _ := url.Parse(s.dbURL)
		u.Host = g.Addr()
		return u.String()
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	admin := func() string { return fmt.Sprintf("127.0.0.1:%d", freePort(t)) }
	common := slices.Concat(base, []string{"NATS_URL=" + s.nats.URL(), "QUILL_STREAM=" + streamName,
		"QUILL_SUBJECT_PREFIX=" + subjectPrefix, "QUILL_LOG_LEVEL=info"})
	env := func(extra ...string) []string { return slices.Concat(common, extra) }
	s.apiURL = "http://" + httpAddr
	apiAdmin, relayAdmin, workerAdmin := admin(), admin(), admin()
	s.api = newDaemon("api", s.bins.api, apiAdmin, filepath.Join(dir, "api.log"),
		env("DATABASE_URL="+s.dbURL, "QUILL_HTTP_ADDR="+httpAddr, "QUILL_ADMIN_ADDR="+apiAdmin), "serve")
	// A short backoff cap, so that a NATS outage's backlog is taken up
	// within seconds of NATS coming back. (A killed relay's claims end with
	// its session; the lease stays at its default.)
	s.relay = newDaemon("relay", s.bins.relay, relayAdmin, filepath.Join(dir, "relay.log"),
		env("DATABASE_URL="+viaGate(s.gateRelay), "QUILL_ADMIN_ADDR="+relayAdmin, "QUILL_RELAY_MAX_BACKOFF=5s"), "run")
	// A short ack wait, so that a killed worker's messages come back soon.
	s.worker = newDaemon("attachment-worker", s.bins.worker, workerAdmin, filepath.Join(dir, "attachment-worker.log"),
		env("DATABASE_URL="+viaGate(s.gateWorker), "QUILL_ADMIN_ADDR="+workerAdmin,
			"QUILL_CONSUMER="+consumerName, "QUILL_ACK_WAIT=5s"), "run")
	for _, d := range []*daemon{s.api, s.relay, s.worker} {
		go d.Run()
		t.Cleanup(func() { _ = d.Stop(40 * time.Second) })
	}
	for _, d := range []*daemon{s.api, s.relay, s.worker} {
		require.NoError(t, d.WaitHealthy(t.Context(), 90*time.Second))
	}
	s.scraper = newScraper(s.api, s.relay, s.worker)

	u, _ := url.Parse(s.apiURL)
	var err error
	s.proxy, err = faultproxy.New(faultproxy.Config{
		Upstream:        u,
		DropProbability: p.DropProbability,
		Eligible:        func(r *http.Request) bool { return r.Method == http.MethodPost || r.Method == http.MethodDelete },
		Seed:            seed,
	})
	require.NoError(t, err)
	t.Cleanup(s.proxy.Close)
	return s
}

// proxyURL serves the proxy for the rest of the test.
func (s *system) proxyURL(t *testing.T) string {
	srv := httptest.NewServer(s.proxy)
	t.Cleanup(srv.Close)
	return srv.URL
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
	if !s.nats.Running() {
		if err := s.nats.Start(ctx); err != nil {
			return err
		}
	}
	for _, d := range []*daemon{s.api, s.relay, s.worker} {
		if err := d.WaitHealthy(ctx, time.Until(deadline)); err != nil {
			return err
		}
	}
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	nc, err := nats.Connect(s.nats.URL(), nats.Name("e2e-drain"), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	lastLog := time.Now()
	for {
		var unpublished, parked, waiting int64
		err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL), count(*) FILTER (WHERE parked_at IS NOT NULL)
			FROM outbox_events`).Scan(&unpublished, &parked)
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM outbox_events e JOIN attachments a ON a.note_id = e.aggregate_id
				WHERE e.type = 'note.created' AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = $1 AND i.event_id = e.id)`,
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
	env := slices.Concat(cleanEnv(), []string{"DATABASE_URL=" + s.dbURL, "NATS_URL=" + s.nats.URL(), "QUILL_STREAM=" + streamName,
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
	_, stderr, code := run("audit", "--help")
	if code == 2 && strings.Contains(stderr, "unknown command") {
		t.Logf("NOTE: `api audit` is not in this build yet (%s); the audit step is skipped — the suite's own invariant checks ran", strings.TrimSpace(stderr))
		return
	}
	stdout, stderr, code := run("audit", "--json")
	var rep struct {
		Anomalies []map[string]any `json:"anomalies"`
		Counts    map[string]any   `json:"counts"`
	}
	jerr := json.Unmarshal([]byte(stdout), &rep)
	switch {
	case code != 0:
		t.Errorf("api audit --json exited %d; anomalies %v\nstdout: %s\nstderr: %s", code, rep.Anomalies, trimTo(stdout, 4000), trimTo(stderr, 2000))
	case jerr != nil:
		t.Errorf("api audit --json: stdout is not the JSON report: %v\n%s", jerr, trimTo(stdout, 2000))
	default:
		t.Logf("api audit --json: exit 0, %d anomalies, counts %v", len(rep.Anomalies), rep.Counts)
	}
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
	for _, d := range []*daemon{s.api, s.relay, s.worker} {
		t.Logf("--- %s log, warnings and errors (first 30):\n%s", d.name,
			strings.Join(grepFile(d.logFile, 30, `"level":"error"`, `"level":"warn"`, "panic", "=== e2e"), "\n"))
		t.Logf("--- %s log, last 20 lines:\n%s", d.name, tail(d.logFile, 20))
	}
	t.Logf("--- nats-server log, last 20 lines:\n%s", tail(s.nats.logFile, 20))
	t.Logf("--- postgres log, last 20 lines:\n%s", tail(s.pg.logFile, 20))
	if os.Getenv("QUILL_E2E_ARTIFACTS") == "" {
		t.Logf("set QUILL_E2E_ARTIFACTS=DIR to keep the whole logs and the NATS store")
	}
}
