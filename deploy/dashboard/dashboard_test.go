package dashboard_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
)

// Paths from this package's directory.
const (
	repoRoot      = "../.."
	dashboardFile = "../grafana/dashboards/quill.json"
	rulesFile     = "../prometheus/quill.rules.yml"
)

// testDatabaseURL is internal/dbtest's default: the local test server.
const testDatabaseURL = "postgres://postgres@127.0.0.1:5432/quill_test?sslmode=disable"

// grafanaVariables are the dashboard's Grafana variables and what stands in
// for them when the query is parsed.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// spec are the SPEC §8 metrics each process must export, and the ones
// every process exports.
var spec = map[string][]string{
	"api": {"quill_http_requests_total", "quill_http_request_duration_seconds_bucket", "quill_idempotency_requests_total",
		"quill_business_effects_total"},
	"relay": {"quill_outbox_pending_events", "quill_outbox_oldest_pending_age_seconds", "quill_relay_published_total",
		"quill_relay_publish_errors_total", "quill_relay_duplicates_total", "quill_relay_parked_events"},
	"attachment-worker": {"quill_worker_messages_total", "quill_event_end_to_end_seconds_bucket", "quill_worker_dead_letters",
		"quill_consumer_pending_messages", "quill_consumer_acks_total"},
	"webhook-dispatcher": {"quill_webhook_deliveries_total", "quill_webhook_pending", "quill_webhook_endpoints", "quill_webhook_delivery_seconds_bucket",
		"quill_consumer_pending_messages", "quill_consumer_acks_total", "quill_consumer_dead_letters"},
}

// prometheusSeries are the series Prometheus writes itself for each
// target, which no program exports: the rules' up and absent alerts read
// them.
var prometheusSeries = []string{"up"}

var everyProcess = []string{"quill_build_info", "quill_db_pool_max_conns", "quill_db_pool_acquired_conns", "quill_db_pool_empty_acquires_total"}

// TestQueriesNameExportedMetrics parses every query of the dashboard and of
// the alerting rules with Prometheus's parser and requires each metric it
// selects to be exported by one of the real programs, started from this
// checkout: a renamed metric breaks this test, not a panel in production.
// It also holds each program to its SPEC §8 metrics.
func TestQueriesNameExportedMetrics(t *testing.T) {
	exported := scrapePrograms(t)

	all := map[string]bool{}
	for _, n := range prometheusSeries {
		all[n] = true
	}
	for prog, names := range exported {
		for _, want := range append(slices.Clone(spec[prog]), everyProcess...) {
			require.Truef(t, names[want], "%s does not export %s", prog, want)
		}
		for n := range names {
			all[n] = true
		}
	}

	queries := dashboardQueries(t)
	require.Greater(t, len(queries), 10, "the dashboard's queries were found")
	for where, expr := range ruleQueries(t) {
		queries[where] = expr
	}
	p := parser.NewParser(parser.Options{})
	for where, expr := range queries {
		q := grafanaVariables.Replace(expr)
		require.NotContainsf(t, q, "$", "%s: a Grafana variable the test does not know: %s", where, expr)
		ast, err := p.ParseExpr(q)
		require.NoErrorf(t, err, "%s: %s", where, expr)
		names := selectedMetrics(ast)
		require.NotEmptyf(t, names, "%s selects no metric: %s", where, expr)
		for _, n := range names {
			require.Truef(t, all[n], "%s names %s, which no program exports: %s", where, n, expr)
		}
	}
}

// selectedMetrics returns the metric names an expression selects.
func selectedMetrics(ast parser.Node) []string {
	var out []string
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		out = append(out, name)
		return nil
	})
	return out
}

// dashboardQueries returns every query of the dashboard by panel title.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	type panel struct {
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))
	out := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[fmt.Sprintf("panel %q query %s", p.Title, tg.RefID)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// ruleQueries returns every rule's expression by its name, parsed and
// validated as Prometheus loads the file.
func ruleQueries(t *testing.T) map[string]string {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	require.Empty(t, errs)
	out := map[string]string{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			out["rule "+r.Alert+r.Record] = r.Expr
		}
	}
	require.NotEmpty(t, out)
	return out
}

// scrapePrograms builds api, relay, attachment-worker and
// webhook-dispatcher from the repository, runs them against a database of their own on the test
// server and a NATS server of their own, answers one API request (so that
// the per-request series exist) and returns the metric names each one's
// /metrics exports: families, plus _bucket, _sum and _count of histograms
// and summaries.
func scrapePrograms(t *testing.T) map[string]map[string]bool {
	t.Helper()
	bin := t.TempDir()
	build(t, bin)

	natsPort := freePort(t)
	startProcess(t, "nats-server", filepath.Join(bin, "nats-server"), nil,
		"-js", "-a", "127.0.0.1", "-p", fmt.Sprint(natsPort), "-sd", t.TempDir())
	dbURL := database(t)
	env := []string{"DATABASE_URL=" + dbURL, fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", natsPort), "QUILL_LOG_LEVEL=warn"}

	migrate := exec.CommandContext(t.Context(), filepath.Join(bin, "api"), "migrate")
	migrate.Env = append(os.Environ(), env...)
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, "api migrate: %s", out)

	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	admin := map[string]string{}
	for _, prog := range []string{"api", "relay", "attachment-worker", "webhook-dispatcher"} {
		admin[prog] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		penv := append(slices.Clone(env), "QUILL_ADMIN_ADDR="+admin[prog])
		args := []string{}
		switch prog {
		case "api":
			penv = append(penv, "QUILL_HTTP_ADDR="+apiAddr)
			args = []string{"serve"}
		case "webhook-dispatcher":
			// Any key will do: no endpoint exists, so none is opened.
			penv = append(penv, "QUILL_WEBHOOK_SECRET_KEY="+base64.StdEncoding.EncodeToString(make([]byte, 32)))
		}
		startProcess(t, prog, filepath.Join(bin, prog), penv, args...)
	}
	for prog, addr := range admin {
		waitReady(t, prog, "http://"+addr+"/readyz")
	}
	resp, err := http.Get("http://" + apiAddr + "/v1/notes")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	names := map[string]map[string]bool{}
	for prog, addr := range admin {
		names[prog] = scrape(t, "http://"+addr+"/metrics")
	}
	return names
}

// build builds the programs and nats-server (at the version Quill's go.mod
// pins) into dir.
func build(t *testing.T, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"build", "-o", dir + "/", "./cmd/api", "./cmd/relay", "./cmd/attachment-worker", "./cmd/webhook-dispatcher"},
		{"build", "-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"},
	} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = repoRoot
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	}
}

// database creates a database of the test's own on the test server (as
// internal/dbtest.Database does: the relay's LISTEN and advisory locks are
// per database) and drops it when the test ends.
func database(t *testing.T) string {
	t.Helper()
	base := os.Getenv("QUILL_TEST_DATABASE_URL")
	if base == "" {
		base = testDatabaseURL
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "quill_dash_" + hex.EncodeToString(b[:])
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.Path = "/" + name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	return u.String() // api migrate creates it
}

// startProcess starts a program with env added to this process's, its
// output in a log file shown when the test fails, and stops it with
// SIGTERM when the test ends.
func startProcess(t *testing.T, name, path string, env []string, args ...string) {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logFile)
	require.NoError(t, err)
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	require.NoError(t, cmd.Start(), "start %s", name)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("%s's output:\n%s", name, b)
		}
	})
}

// waitReady polls a /readyz until it answers 200, failing after a minute.
func waitReady(t *testing.T, prog, u string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(u)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Failf(t, "not ready", "%s did not become ready within a minute: %s", prog, last)
}

// scrape returns the metric names of a /metrics page in Prometheus's text
// format, read from its TYPE lines.
func scrape(t *testing.T, u string) map[string]bool {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		names[f[2]] = true
		switch f[3] {
		case "histogram":
			names[f[2]+"_bucket"], names[f[2]+"_sum"], names[f[2]+"_count"] = true, true, true
		case "summary":
			names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, names, "%s exports no metric", u)
	return names
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
