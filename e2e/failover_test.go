package e2e

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/wait"
)

// standbyName is the standby's application_name, which the primary's
// synchronous_standby_names waits for.
const standbyName = "quill_standby"

// failoverProfile is TestPostgresFailover's load: 1,500 operations over
// about 60 s through the response-dropping proxy, with the primary lost
// two fifths in; no other fault, so that whatever goes wrong is the
// failover's.
func failoverProfile() profile {
	return profile{
		Name: "failover", Ops: 1500, Clients: 64, Rate: 1500.0 / 60,
		DropProbability: 0.1,
		OpDeadline:      2 * time.Minute, DrainTimeout: 4 * time.Minute,
	}
}

// startStandby makes a streaming standby of primary with pg_basebackup, on
// a port of its own, starts it, and makes it the primary's synchronous
// standby: from then on a COMMIT returns only once the standby has the
// commit's WAL, so every acknowledged write survives the primary's loss.
// Stopped and removed when t ends, as the primary is.
func startStandby(t *testing.T, primary *pgCluster) *pgCluster {
	t.Helper()
	base, err := os.MkdirTemp("", "quill-e2e-pg-standby-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o755))
	if primary.cred != nil {
		require.NoError(t, os.Chown(base, int(primary.cred.Uid), int(primary.cred.Gid)))
	}
	c := &pgCluster{bindir: primary.bindir, base: base, data: filepath.Join(base, "data"),
		logFile: filepath.Join(base, "postgres.log"), port: freePort(t), cred: primary.cred}
	t.Cleanup(func() {
		_ = c.pgctl(context.Background(), "-m", "immediate", "stop")
		if os.Getenv("QUILL_E2E_KEEP") == "" {
			os.RemoveAll(base)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// initdb's pg_hba.conf trusts replication connections from 127.0.0.1.
	out, err := c.command(ctx, filepath.Join(c.bindir, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port),
		"-U", "postgres", "-D", c.data, "-X", "stream", "-c", "fast", "-R", "--no-sync").CombinedOutput()
	require.NoError(t, err, "pg_basebackup:\n%s", out)
	// -R wrote standby.signal and a primary_conninfo; this one, later in
	// the file, wins and names the standby for synchronous_standby_names.
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = fmt.Fprintf(f, "primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s'\n", primary.port, standbyName)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, c.pgctl(ctx, "start"), "pg_ctl start (standby); log:\n%s", tail(c.logFile, 20))

	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+standbyName+"'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	for {
		var state string
		err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, standbyName).Scan(&state)
		if err == nil && state == "sync" {
			return c
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			require.NoError(t, err)
		}
		require.True(t, wait.For(ctx, 100*time.Millisecond), "the standby is the primary's synchronous standby within 2 minutes (state %q); standby log:\n%s", state, tail(c.logFile, 20))
	}
}

// multiHostURL is database db on both servers, the writable one chosen at
// each connection: what an operator gives every process in front of a
// primary and its standby.
func multiHostURL(db string, servers ...*pgCluster) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", s.port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(hosts, ","), db)
}

// failover loses the primary's machine at a point of the load — every
// process of the primary's server killed at once, its process group
// SIGKILLed — promotes the standby, and measures how long writes stopped:
// from the kill to the first operation the new primary committed.
type failover struct {
	s      *system
	at     time.Duration
	events []faultEvent

	killedAt  time.Time
	promoted  time.Duration // kill → pg_ctl promote returned
	resumed   time.Duration // kill → the first operation committed after it
	syncState string        // the standby's state just before the kill
}

func (f *failover) Events() []faultEvent { return f.events }

func (f *failover) Run(ctx context.Context, start time.Time) {
	if !wait.For(ctx, time.Until(start.Add(f.at))) {
		return
	}
	ev := func(kind string, ok bool, detail string) {
		f.events = append(f.events, faultEvent{At: time.Since(start), Kind: kind, OK: ok, Detail: detail})
	}
	f.syncState = replicationState(ctx, f.s.pg)
	pid, err := postmasterPID(f.s.pg.data)
	if err != nil {
		ev("primary lost", false, err.Error())
		return
	}
	pgid, err := syscall.Getpgid(pid)
	if err == nil {
		f.killedAt = time.Now()
		err = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	if err != nil {
		ev("primary lost", false, fmt.Sprintf("SIGKILL process group of postmaster %d: %v", pid, err))
		return
	}
	for syscall.Kill(pid, 0) == nil {
		if !wait.For(ctx, 10*time.Millisecond) {
			return
		}
	}
	ev("primary lost", true, fmt.Sprintf("process group %d SIGKILLed (postmaster %d); standby was %q", pgid, pid, f.syncState))

	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := f.s.standby.pgctl(pctx, "promote"); err != nil {
		ev("standby promoted", false, err.Error())
		return
	}
	f.promoted = time.Since(f.killedAt)
	ev("standby promoted", true, fmt.Sprintf("pg_ctl promote returned %.2fs after the kill", f.promoted.Seconds()))

	conn, err := pgx.Connect(pctx, f.s.standby.URL(dbName(f.s.dbURL)))
	if err != nil {
		ev("writes resumed", false, err.Error())
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var first *time.Time
		err := conn.QueryRow(pctx, `SELECT min(completed_at) FROM operations WHERE completed_at > $1`, f.killedAt).Scan(&first)
		if err == nil && first != nil {
			f.resumed = first.Sub(f.killedAt)
			ev("writes resumed", true, fmt.Sprintf("the first operation after the kill committed %.2fs after it", f.resumed.Seconds()))
			return
		}
		if err != nil || !wait.For(pctx, 50*time.Millisecond) {
			ev("writes resumed", false, fmt.Sprintf("no operation committed on the new primary: %v", cmpErr(err, pctx.Err())))
			return
		}
	}
}

func cmpErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// replicationState is the synchronous standby's sync_state as the primary
// sees it ("sync" once it waits for it), or what went wrong.
func replicationState(ctx context.Context, primary *pgCluster) string {
	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		return "unknown: " + err.Error()
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var state string
	if err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, standbyName).Scan(&state); err != nil {
		return "unknown: " + err.Error()
	}
	return state
}

// postmasterPID reads the postmaster's pid, the first line of
// postmaster.pid in the data directory.
func postmasterPID(data string) (int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// dbName is the database a PostgreSQL URL names.
func dbName(dbURL string) string {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return ""
	}
	return cfg.Database
}

// TestPostgresFailover loses PostgreSQL's primary mid-load — its whole
// process group SIGKILLed, as when its machine is lost — and promotes its
// synchronous standby, while every process runs with one multi-host
// DATABASE_URL (target_session_attrs=read-write) and clients resend
// through a response-dropping proxy. Then every acknowledged write must
// be on the new primary, every business action must have reached one
// explainable final state with no effect doubled (the fault suite's
// checks and `api audit`), and no daemon may have exited: each rides
// through on its own — the API, two relays, the worker and a webhook
// dispatcher. The time until writes resumed is reported.
func TestPostgresFailover(t *testing.T) {
	// Not parallel: see TestDemo.
	if testing.Short() {
		t.Skip("e2e: runs the real programs against a primary and a standby; skipped with -short")
	}
	p := failoverProfile()
	var (
		fo   *failover
		disp *daemon
	)
	r := runSuite(t, p, topology{APIs: 1, Relays: 2, Workers: 1, Standby: true}, func(s *system, _ *loadGen, _ *mrand.Rand) faultRunner {
		// A webhook dispatcher too, on the same URL: its consumer's
		// transactions ride through the failover like the worker's.
		disp = startDispatcher(t, s, "webhook-dispatcher")
		fo = &failover{s: s, at: p.Duration() * 2 / 5}
		return fo
	})
	require.Len(t, fo.events, 3, "the primary lost, the standby promoted, writes resumed: %+v", fo.events)
	for _, e := range fo.events {
		require.True(t, e.OK, "%s: %s", e.Kind, e.Detail)
	}
	require.Equal(t, "sync", fo.syncState, "the standby was synchronous when the primary was lost")
	for _, d := range append(r.s.daemons(), disp) {
		exits, _ := d.Exits()
		require.Empty(t, exits, "%s kept running through the failover (see %s)", d.name, d.logFile)
	}
	t.Logf("failover: standby promoted %.2fs after the primary was lost; writes resumed %.2fs after it",
		fo.promoted.Seconds(), fo.resumed.Seconds())
	r.finish(t)
}
