package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/testkit"
)

const waitLong = 30 * time.Second

// onlyLogLine requires logs to be one JSON log line and returns it.
func onlyLogLine(t *testing.T, logs string) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	require.Len(t, lines, 1, "one line: %q", logs)
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &line), "a JSON log line: %s", lines[0])
	return line
}

// waitStatus polls url until it answers status, and returns the body.
func waitStatus(t *testing.T, url string, status int) string {
	t.Helper()
	var body string
	testkit.WaitFor(t, waitLong, func() bool {
		res, err := http.Get(url)
		if err != nil {
			return false
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		body = string(b)
		return res.StatusCode == status
	}, url+" to answer "+http.StatusText(status))
	return body
}

// world is what a relay process needs: a fresh schema, an in-process NATS
// server, and a stream, subject prefix and tenant named uniquely (LISTEN
// channels and advisory locks are per database, shared by parallel tests).
type world struct {
	t      *testing.T
	pool   *pgxpool.Pool
	srv    *natstest.Server
	js     jetstream.JetStream
	vars   map[string]string
	suffix string
	stream string
	prefix string
	tenant string
	admin  string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	pool, dbURL := dbtest.Pool(t, 4)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	w := &world{t: t, pool: pool, srv: srv, js: js, suffix: suffix,
		stream: "RELAY_" + strings.ToUpper(suffix), prefix: "q" + suffix, tenant: "acme-" + suffix, admin: clitest.FreeAddr(t)}
	w.vars = map[string]string{
		"DATABASE_URL":         dbURL,
		"NATS_URL":             srv.URL(),
		"QUILL_ADMIN_ADDR":     w.admin,
		"QUILL_STREAM":         w.stream,
		"QUILL_SUBJECT_PREFIX": w.prefix,
		// Past the relay's worst republish delay at its fixed
		// timings (71s).
		"QUILL_DUPLICATE_WINDOW": "2m",
		"QUILL_STREAM_MAX_AGE":   "1h",
	}
	return w
}

// onCluster points the world at a three-node cluster instead of its one
// server: relays get the cluster's server list, and the test observes
// through the cluster.
func (w *world) onCluster() (*natstest.Cluster, jetstream.JetStream) {
	w.t.Helper()
	cl := natstest.StartCluster(w.t, 3)
	_, js := cl.Connect(w.t)
	w.js = js
	w.vars["NATS_URL"] = cl.URLs()
	return cl, js
}

func (w *world) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	w.t.Cleanup(cancel)
	return ctx
}

// write commits one event for tenant and notifies the relays, as the API
// does; it returns the event id.
func (w *world) write(tenant string) uuid.UUID {
	w.t.Helper()
	return w.writeData(tenant, nil)
}

// writeData is write with data added to the event's.
func (w *world) writeData(tenant string, extra map[string]any) uuid.UUID {
	w.t.Helper()
	ctx := w.ctx()
	note := uuid.New()
	data := map[string]any{"id": note.String()}
	maps.Copy(data, extra)
	e := outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: tenant, AggregateID: note, Type: contract.EventNoteCreated,
		Time: time.Now(), Data: data}
	require.NoError(w.t, db.WithTx(ctx, w.pool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }))
	_, err := w.pool.Exec(ctx, `SELECT pg_notify($1, '')`, outbox.NotifyChannel)
	require.NoError(w.t, err)
	return e.ID
}

func (w *world) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.pool.QueryRow(w.ctx(), sql, args...).Scan(&n))
	return n
}

func (w *world) waitPublished(n int) {
	w.t.Helper()
	testkit.WaitFor(w.t, waitLong, func() bool {
		return w.count(`SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL`) == n
	}, "events published")
}

// streamIDs returns the Nats-Msg-Id of every message in the stream, failing
// if one appears twice.
func (w *world) streamIDs() map[string]string {
	w.t.Helper()
	ids := map[string]string{}
	for _, m := range natstest.StreamMessages(w.t, w.js, w.stream, "") {
		id := m.Header.Get(jetstream.MsgIDHeader)
		_, twice := ids[id]
		require.False(w.t, twice, "event %s is in the stream twice", id)
		ids[id] = m.Subject
	}
	return ids
}

func TestHelp(t *testing.T) {
	t.Parallel()
	getenv := clitest.Env(nil)
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		out, _, err := clitest.RunOut(t, run, getenv, args...)
		require.NoError(t, err, "%q", args)
		require.Contains(t, out, "relay events list --parked")
		require.Contains(t, out, "relay events retry ID")
	}

	out, _, err := clitest.RunOut(t, run, getenv, "run", "--help")
	require.ErrorIs(t, err, flag.ErrHelp)
	var stderr bytes.Buffer
	require.Zero(t, exitCode(err, &stderr))
	require.Empty(t, stderr.String())
	for _, v := range []string{"DATABASE_URL", "NATS_URL", "QUILL_ADMIN_ADDR", "QUILL_STREAM", "QUILL_SUBJECT_PREFIX",
		"QUILL_DUPLICATE_WINDOW", "QUILL_STREAM_MAX_AGE", "QUILL_STREAM_REPLICAS", "QUILL_NATS_CREDS", "QUILL_NATS_TLS_CA", "QUILL_NATS_TLS_CERT", "QUILL_NATS_TLS_KEY",
		"QUILL_OUTBOX_RETENTION", "QUILL_INBOX_RETENTION", "QUILL_LOG_LEVEL"} {
		require.Contains(t, out, v)
	}
	for _, r := range removed {
		require.NotContains(t, out, r.Env, "a fixed value, not a setting")
	}

	for _, args := range [][]string{{"events", "--help"}, {"events", "list", "--help"}, {"events", "retry", "--help"}} {
		out, _, err := clitest.RunOut(t, run, getenv, args...)
		require.Zero(t, exitCode(err, io.Discard), "%q: %v", args, err)
		require.Contains(t, out, "relay events list --parked", "%q", args)
	}
}

func TestCommandLineErrors(t *testing.T) {
	t.Parallel()
	// Nothing listens here: a command that reached PostgreSQL or NATS
	// would fail with a logged error (exit 1), not a usage error (exit 2).
	getenv := clitest.Env(map[string]string{
		"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2",
		"NATS_URL":     "nats://127.0.0.1:1",
	})
	cases := []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{args: []string{"publish"}, want: []string{`unknown command "publish"`}},
		{args: []string{"run", "extra"}, want: []string{"unexpected arguments"}},
		{env: map[string]string{"QUILL_DUPLICATE_WINDOW": "banana"}, want: []string{`invalid QUILL_DUPLICATE_WINDOW "banana"`}},
		// The removed settings' flags are unknown (decision 0076).
		{args: []string{"--lease", "1s"}, want: []string{"flag provided but not defined: -lease"}},
		{args: []string{"--poll-interval", "1s"}, want: []string{"flag provided but not defined: -poll-interval"}},
		{args: []string{"--max-backoff", "1s"}, want: []string{"flag provided but not defined: -max-backoff"}},
		{args: []string{"--batch", "1"}, want: []string{"flag provided but not defined: -batch"}},
		// Zero is refused, not silently taken for the default.
		{env: map[string]string{"QUILL_DUPLICATE_WINDOW": "0s"}, want: []string{"QUILL_DUPLICATE_WINDOW", "greater than 0"}},
		{env: map[string]string{"QUILL_OUTBOX_RETENTION": "0"}, want: []string{"QUILL_OUTBOX_RETENTION", "greater than 0"}},
		{args: []string{"--duplicate-window", "0s"}, want: []string{"--duplicate-window", "greater than 0"}},
		{env: map[string]string{"QUILL_OUTBOX_RETENTION": "a week"}, want: []string{"QUILL_OUTBOX_RETENTION"}},
		{env: map[string]string{"QUILL_LOG_LEVEL": "loud"}, want: []string{"QUILL_LOG_LEVEL"}},
		// Horizons that do not nest name the settings involved, and the
		// relay's fixed timings: 10s + 30s + 30s + 1s.
		{env: map[string]string{"QUILL_DUPLICATE_WINDOW": "71s"}, want: []string{"QUILL_DUPLICATE_WINDOW 1m11s", "lease 30s", "= 1m11s"}},
		{env: map[string]string{"QUILL_DUPLICATE_WINDOW": "200h"}, want: []string{"QUILL_DUPLICATE_WINDOW 200h0m0s", "QUILL_STREAM_MAX_AGE 168h0m0s"}},
		{env: map[string]string{"QUILL_STREAM_MAX_AGE": "400h"}, want: []string{"QUILL_INBOX_RETENTION 336h0m0s", "QUILL_STREAM_MAX_AGE 400h0m0s"}},
		{env: map[string]string{"QUILL_STREAM_REPLICAS": "0"}, want: []string{`invalid QUILL_STREAM_REPLICAS "0"`, "1 to 5"}},
		{env: map[string]string{"QUILL_STREAM_REPLICAS": "6"}, want: []string{`invalid QUILL_STREAM_REPLICAS "6"`, "1 to 5"}},
		{env: map[string]string{"QUILL_STREAM_REPLICAS": "three"}, want: []string{`invalid QUILL_STREAM_REPLICAS "three"`, "not an integer"}},
		{args: []string{"--stream-replicas", "-1"}, want: []string{`invalid --stream-replicas "-1"`}},
		// NATS settings: a server list with a malformed entry, unreadable
		// files, a certificate without its key.
		{env: map[string]string{"NATS_URL": "nats://127.0.0.1:1,nats://:4222"}, want: []string{`invalid NATS_URL "nats://127.0.0.1:1,nats://:4222"`, "server 2 of 2", "no host"}},
		{env: map[string]string{"NATS_URL": "nats://127.0.0.1:1,"}, want: []string{`invalid NATS_URL`, "server 2 of 2 is empty"}},
		{env: map[string]string{"QUILL_NATS_CREDS": "/nonexistent/user.creds"}, want: []string{`invalid QUILL_NATS_CREDS "/nonexistent/user.creds"`, "no such file"}},
		{env: map[string]string{"QUILL_NATS_TLS_CA": "/nonexistent/ca.pem"}, want: []string{`invalid QUILL_NATS_TLS_CA`}},
		{env: map[string]string{"QUILL_NATS_TLS_CERT": "run.go"}, want: []string{"QUILL_NATS_TLS_CERT is set without QUILL_NATS_TLS_KEY"}},
		{args: []string{"--nats-tls-key", "/nonexistent/key.pem"}, want: []string{`invalid --nats-tls-key "/nonexistent/key.pem"`}},
		{args: []string{"events"}, want: []string{"usage: relay events"}},
		{args: []string{"events", "bogus"}, want: []string{`unknown events command "bogus"`}},
		{args: []string{"events", "list"}, want: []string{"usage: relay events"}},
		{args: []string{"events", "list", "--parked", "extra"}, want: []string{"usage: relay events"}},
		{args: []string{"events", "retry"}, want: []string{"usage: relay events"}},
		{args: []string{"events", "retry", "not-an-id"}, want: []string{`"not-an-id" is not an event id`}},
		{args: []string{"events", "retry", "--all", "0190c6b8-0000-7000-8000-000000000000"}, want: []string{"usage: relay events"}},
	}
	for _, tc := range cases {
		name := strings.Join(tc.args, " ")
		for k, v := range tc.env {
			name += " " + k + "=" + v
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := func(k string) string {
				if v, ok := tc.env[k]; ok {
					return v
				}
				return getenv(k)
			}
			_, _, err := clitest.RunOut(t, run, g, tc.args...)
			var uerr cli.UsageError
			require.ErrorAs(t, err, &uerr)
			var stderr bytes.Buffer
			require.Equal(t, 2, exitCode(err, &stderr))
			for _, w := range tc.want {
				require.Contains(t, stderr.String(), w)
			}
			require.True(t, strings.HasPrefix(stderr.String(), "relay: "))
			require.NotContains(t, strings.TrimSpace(stderr.String()), "\n", "one line")
		})
	}
}

// The relay's removed settings (decision 0076), still set in an env file,
// are each a warning naming the value now fixed, and the relay goes on
// starting: here it then fails to reach PostgreSQL (exit 1), not a usage
// error.
func TestRemovedSettingsAreWarnings(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": "postgres://postgres@" + clitest.FreeAddr(t) + "/quill?sslmode=disable&connect_timeout=2",
		"QUILL_ADMIN_ADDR":  clitest.FreeAddr(t),
		"QUILL_RELAY_BATCH": "1", "QUILL_RELAY_LEASE": "1s", "QUILL_RELAY_POLL_INTERVAL": "100ms", "QUILL_RELAY_MAX_BACKOFF": "5s"}
	_, logs, err := clitest.RunOut(t, run, clitest.Env(vars))
	require.Equal(t, 1, exitCode(err, io.Discard), "err: %v", err)
	for env, fixed := range map[string]string{"QUILL_RELAY_BATCH": "256", "QUILL_RELAY_LEASE": "30s", "QUILL_RELAY_POLL_INTERVAL": "1s", "QUILL_RELAY_MAX_BACKOFF": "30s"} {
		require.Contains(t, logs, `"setting":"`+env+`","fixed":"`+fixed+`"`)
	}
	require.Contains(t, logs, `"error_category":"database_unreachable"`)
}

// make bench-relay runs the relays at their fixed batch and bounds the raw
// publisher's pending acks by it: the script's copy of the constant is the
// relay's.
func TestBenchRelayKnowsTheBatch(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile("../../scripts/bench-relay.sh")
	require.NoError(t, err)
	require.Contains(t, string(script), fmt.Sprintf("\nRELAY_BATCH=%d\n", relay.DefaultBatch))
}

// TestUnreachableDependencyAtStart: a dependency that is not there at start
// is one clear error log line and exit status 1 — no retry loop, no stack.
func TestUnreachableDependencyAtStart(t *testing.T) {
	t.Parallel()
	schema := dbtest.Schema(t)
	cases := []struct {
		name     string
		args     []string
		vars     map[string]string
		category string
		names    string
	}{
		{name: "NATS", vars: map[string]string{"DATABASE_URL": schema, "NATS_URL": "nats://" + clitest.FreeAddr(t)},
			category: "nats_unreachable", names: "NATS_URL"},
		{name: "PostgreSQL", vars: map[string]string{"DATABASE_URL": "postgres://postgres@" + clitest.FreeAddr(t) + "/quill?sslmode=disable&connect_timeout=2"},
			category: "database_unreachable", names: "DATABASE_URL"},
		{name: "PostgreSQL for events list", args: []string{"events", "list", "--parked"},
			vars:     map[string]string{"DATABASE_URL": "postgres://postgres@" + clitest.FreeAddr(t) + "/quill?sslmode=disable&connect_timeout=2"},
			category: "database_unreachable", names: "DATABASE_URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.vars["QUILL_ADMIN_ADDR"] = clitest.FreeAddr(t)
			start := time.Now()
			_, logs, err := clitest.RunOut(t, run, clitest.Env(tc.vars), tc.args...)
			require.Error(t, err)
			require.Less(t, time.Since(start), 10*time.Second, "no retry loop at start")
			var stderr bytes.Buffer
			require.Equal(t, 1, exitCode(err, &stderr))
			require.Empty(t, stderr.String(), "the error is not printed twice")
			line := onlyLogLine(t, logs)
			require.Equal(t, "error", line["level"])
			require.Equal(t, tc.category, line["error_category"])
			require.Equal(t, "relay", line["process"])
			require.Contains(t, line["message"], tc.names)
			require.NotContains(t, logs, "goroutine ")
		})
	}
}

// TestOperatorsReplicatedStream: relays started and restarted against an
// operator's R3 stream on a three-node cluster leave it at R3 with the
// operator's settings, and publish to it through the cluster's server list.
func TestOperatorsReplicatedStream(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cl, js := w.onCluster()
	op := jetstream.StreamConfig{Name: w.stream, Subjects: []string{w.prefix + ".>"}, Storage: jetstream.FileStorage,
		Replicas: 3, Duplicates: 3 * time.Minute, MaxAge: 2 * time.Hour, MaxMsgs: 123456, MaxBytes: 1 << 30,
		Description: "set by the operator", Compression: jetstream.S2Compression}
	_, err := js.CreateStream(w.ctx(), op)
	require.NoError(t, err)
	cl.WaitForStreamReplicas(t, js, w.stream, 3)

	for i := range 2 { // a start and a restart of two relays
		a := clitest.Start(t, run, clitest.Env(w.vars))
		bvars := maps.Clone(w.vars)
		bvars["QUILL_ADMIN_ADDR"] = clitest.FreeAddr(t)
		b := clitest.Start(t, run, clitest.Env(bvars))
		waitStatus(t, "http://"+w.admin+"/readyz", http.StatusOK)
		waitStatus(t, "http://"+bvars["QUILL_ADMIN_ADDR"]+"/readyz", http.StatusOK)
		w.write(w.tenant)
		w.waitPublished(i + 1)
		require.NoError(t, a.Stop())
		require.NoError(t, b.Stop())

		st, err := js.Stream(w.ctx(), w.stream)
		require.NoError(t, err)
		cfg := st.CachedInfo().Config
		require.Equal(t, 3, cfg.Replicas, "the operator's replicas are kept")
		require.Equal(t, 2*time.Minute, cfg.Duplicates, "Quill's window")
		require.Equal(t, time.Hour, cfg.MaxAge, "Quill's MaxAge")
		require.Equal(t, op.MaxMsgs, cfg.MaxMsgs)
		require.Equal(t, op.MaxBytes, cfg.MaxBytes)
		require.Equal(t, op.Description, cfg.Description)
		require.Equal(t, op.Compression, cfg.Compression)
	}
	require.Len(t, w.streamIDs(), 2)

	// Asked for, the replicas change.
	w.vars["QUILL_STREAM_REPLICAS"] = "1"
	p := clitest.Start(t, run, clitest.Env(w.vars))
	waitStatus(t, "http://"+w.admin+"/readyz", http.StatusOK)
	require.NoError(t, p.Stop())
	st, err := js.Stream(w.ctx(), w.stream)
	require.NoError(t, err)
	require.Equal(t, 1, st.CachedInfo().Config.Replicas)
	require.Equal(t, op.Description, st.CachedInfo().Config.Description)
}

// TestClusterFailover: a relay given the cluster's server list creates the
// stream R3 (QUILL_STREAM_REPLICAS=3) and, as each node in turn is stopped
// (the one the relay is connected to among them) and started again, keeps
// publishing from where the outbox stands: every event once, none parked.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cl, js := w.onCluster()
	w.vars["QUILL_STREAM_REPLICAS"] = "3"
	p := clitest.Start(t, run, clitest.Env(w.vars))
	waitStatus(t, "http://"+w.admin+"/readyz", http.StatusOK)
	cl.WaitForStreamReplicas(t, js, w.stream, 3)

	written := 0
	for i := range 3 {
		cl.Stop(i)
		for range 3 {
			w.write(w.tenant)
			written++
		}
		w.waitPublished(written)
		cl.Restart(t, i)
		cl.WaitForStreamReplicas(t, js, w.stream, 3)
	}
	require.Len(t, w.streamIDs(), written)
	require.Zero(t, w.count(`SELECT count(*) FROM outbox_events WHERE parked_at IS NOT NULL`))
	require.NoError(t, p.Stop())
}

// TestDaemon runs the relay as operators do: it provisions the stream,
// publishes committed events, reports not ready while NATS is down and
// publishes what was written meanwhile once NATS is back, exports its
// metrics, and stops cleanly (exit 0) on SIGTERM.
func TestDaemon(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	p := clitest.Start(t, run, clitest.Env(w.vars)) // run is the default command
	readyz := "http://" + w.admin + "/readyz"
	waitStatus(t, readyz, http.StatusOK)

	st, err := w.js.Stream(w.ctx(), w.stream)
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	require.Equal(t, []string{w.prefix + ".>"}, cfg.Subjects)
	require.Equal(t, jetstream.FileStorage, cfg.Storage)
	require.Equal(t, 2*time.Minute, cfg.Duplicates)
	require.Equal(t, time.Hour, cfg.MaxAge)

	var ids []uuid.UUID
	for range 3 {
		ids = append(ids, w.write(w.tenant))
	}
	w.waitPublished(3)

	w.srv.Stop()
	body := waitStatus(t, readyz, http.StatusServiceUnavailable)
	require.Contains(t, body, "nats")
	for range 3 {
		ids = append(ids, w.write(w.tenant))
	}
	w.srv.Restart(t)
	waitStatus(t, readyz, http.StatusOK)
	w.waitPublished(6)
	inStream := w.streamIDs()
	require.Len(t, inStream, 6)
	for _, id := range ids {
		require.Equal(t, w.prefix+"."+w.tenant+".note.created", inStream[id.String()], "event %s", id)
	}

	res, err := http.Get("http://" + w.admin + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, m := range []string{"quill_relay_published_total", "quill_relay_publish_errors_total", "quill_relay_duplicates_total",
		"quill_outbox_pending_events", "quill_outbox_oldest_pending_age_seconds"} {
		require.Contains(t, string(metrics), "\n"+m+" ", "metric %s", m)
	}
	res, err = http.Get("http://" + w.admin + "/healthz")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	err = p.Stop()
	require.NoError(t, err, "SIGTERM: a graceful stop")
	require.Zero(t, exitCode(err, io.Discard))
	logs := p.Stderr.String()
	require.Contains(t, logs, `"message":"stream provisioned"`)
	require.Contains(t, logs, `"error_category":"nats_disconnected"`)
	require.Contains(t, logs, `"message":"stopped"`)
	require.NotContains(t, logs, `"level":"error"`)
}

// TestParkedEventRetryFromTheCommandLine: an event the stream refuses (an
// operator set the stream's MaxMsgSize below its size, a setting the relay
// keeps) is parked with its reason while the other events flow; `relay
// events list --parked` shows it, and after the operator raised the limit
// `relay events retry ID` has it published.
func TestParkedEventRetryFromTheCommandLine(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	getenv := clitest.Env(w.vars)
	clitest.Start(t, run, getenv)
	waitStatus(t, "http://"+w.admin+"/readyz", http.StatusOK)

	st, err := w.js.Stream(w.ctx(), w.stream)
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 2048
	_, err = w.js.UpdateStream(w.ctx(), cfg)
	require.NoError(t, err)

	other := "globex-" + w.suffix
	first := w.write(w.tenant)
	stuck := w.writeData(other, map[string]any{"padding": strings.Repeat("x", 4096)})
	later := w.write(w.tenant)
	testkit.WaitFor(t, waitLong, func() bool {
		return w.count(`SELECT count(*) FROM outbox_events WHERE id = $1 AND parked_at IS NOT NULL`, stuck) == 1
	}, "the refused event to be parked")
	w.waitPublished(2)
	inStream := w.streamIDs()
	require.Contains(t, inStream, first.String())
	require.Contains(t, inStream, later.String(), "a later event is not held back")

	out, _, err := clitest.RunOut(t, run, getenv, "events", "list", "--parked", "--json")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1, "one JSON object per parked event: %q", out)
	var parked outbox.ParkedEvent
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &parked), lines[0])
	require.Equal(t, stuck, parked.ID)
	require.Equal(t, other, parked.Tenant)
	require.Equal(t, contract.EventNoteCreated, parked.Type)
	require.Contains(t, parked.Reason, "the stream refused the message")
	require.Contains(t, parked.Reason, "message size exceeds maximum allowed")
	require.GreaterOrEqual(t, parked.Attempts, 1)
	require.False(t, parked.ParkedAt.IsZero())

	out, _, err = clitest.RunOut(t, run, getenv, "events", "list", "--parked")
	require.NoError(t, err)
	require.Contains(t, out, stuck.String())
	require.Contains(t, out, "reason: the stream refused the message")

	// The cause is fixed; the operator retries the event.
	cfg.MaxMsgSize = -1
	_, err = w.js.UpdateStream(w.ctx(), cfg)
	require.NoError(t, err)
	out, _, err = clitest.RunOut(t, run, getenv, "events", "retry", stuck.String())
	require.NoError(t, err)
	require.Contains(t, out, "returned to the queue")
	w.waitPublished(3)
	inStream = w.streamIDs()
	require.Len(t, inStream, 3)
	require.Equal(t, w.prefix+"."+other+".note.created", inStream[stuck.String()])

	out, _, err = clitest.RunOut(t, run, getenv, "events", "list", "--parked")
	require.NoError(t, err)
	require.Equal(t, "no parked events\n", out)
	out, _, err = clitest.RunOut(t, run, getenv, "events", "list", "--parked", "--json")
	require.NoError(t, err)
	require.Empty(t, out)

	_, _, err = clitest.RunOut(t, run, getenv, "events", "retry", stuck.String())
	require.ErrorIs(t, err, outbox.ErrNotParked, "a published event is not retried")
	var stderr bytes.Buffer
	require.Equal(t, 1, exitCode(err, &stderr))
	require.Contains(t, stderr.String(), "no parked event with this id")

	// With nothing parked, retry --all returns none.
	out, _, err = clitest.RunOut(t, run, getenv, "events", "retry", "--all")
	require.NoError(t, err)
	require.Equal(t, "0 events returned to the queue (parked ones, and unpublished ones missing from it)\n", out)
}

// A relay whose session URL reaches a transaction pooler refuses to start
// with one line naming the setting (exit 2), before it provisions or
// claims anything; with DATABASE_URL behind the pooler and
// QUILL_RELAY_DATABASE_URL direct it runs, and a write through the pooler
// (its NOTIFY too) is published.
func TestSessionURLThroughPgBouncer(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	direct := w.vars["DATABASE_URL"]
	pooled := dbtest.PgBouncer(t, direct)
	for _, tc := range []struct{ name, dbURL, sessionURL, want string }{
		{"session URL unset, DATABASE_URL pooled", pooled, "", "DATABASE_URL (the relay's session connection, as QUILL_RELAY_DATABASE_URL is unset) reaches a transaction pooler"},
		{"session URL pooled", direct, pooled, "QUILL_RELAY_DATABASE_URL reaches a transaction pooler"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := maps.Clone(w.vars)
			vars["DATABASE_URL"], vars["QUILL_RELAY_DATABASE_URL"] = tc.dbURL, tc.sessionURL
			_, _, err := clitest.RunOut(t, run, clitest.Env(vars))
			var stderr bytes.Buffer
			require.Equal(t, 2, exitCode(err, &stderr), "err: %v", err)
			require.Contains(t, stderr.String(), tc.want)
			require.NotContains(t, strings.TrimSpace(stderr.String()), "\n", "one line")
		})
	}
	_, err := w.js.Stream(w.ctx(), w.stream)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "nothing provisioned")

	vars := maps.Clone(w.vars)
	app := "relay-" + w.suffix
	vars["DATABASE_URL"], vars["QUILL_RELAY_DATABASE_URL"] = pooled, dbtest.WithParam(t, direct, "application_name", app)
	// A poll interval of a minute (in process: it is no setting), so that
	// only the notification can publish in time; the duplicate window past
	// the longer worst republish delay.
	vars["QUILL_DUPLICATE_WINDOW"] = "5m"
	longPoll := func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		return runWith(ctx, args, getenv, stdout, stderr, relay.Config{PollInterval: time.Minute})
	}
	p := clitest.Start(t, longPoll, clitest.Env(vars))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", p.Stderr.String())
		}
	})
	waitStatus(t, "http://"+w.admin+"/readyz", http.StatusOK)
	pooledPool, err := db.Open(w.ctx(), pooled, 2)
	require.NoError(t, err)
	defer pooledPool.Close()
	ctx := w.ctx()
	note := uuid.New()
	e := outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: w.tenant, AggregateID: note, Type: contract.EventNoteCreated,
		Time: time.Now(), Data: map[string]any{"id": note.String()}}
	// Once the relay LISTENs (and has made its catch-up pass), write and
	// notify through the pooler as the API does.
	testkit.WaitFor(t, waitLong, func() bool {
		return w.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app) > 0
	}, "the relay to LISTEN")
	require.NoError(t, db.WithTx(ctx, pooledPool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }))
	_, err = pooledPool.Exec(ctx, `SELECT pg_notify($1, '')`, outbox.NotifyChannel)
	require.NoError(t, err)
	w.waitPublished(1)
	require.Contains(t, w.streamIDs(), e.ID.String())
	require.NoError(t, p.Stop())
}
