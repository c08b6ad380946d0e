package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/natstest"
)

// binaries are the programs under test, built once per run.
type binaries struct{ api, relay, worker, dispatcher, demo, nats string }

// buildBinaries builds api, relay, attachment-worker, webhook-dispatcher,
// demo (without the race
// detector: the suite's own process may carry it, the programs need not)
// and nats-server from the module pinned in go.mod, into dir.
func buildBinaries(t *testing.T, dir string) binaries {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	for _, args := range [][]string{
		{"build", "-o", dir + "/", "./cmd/api", "./cmd/relay", "./cmd/attachment-worker", "./cmd/webhook-dispatcher", "./tools/demo"},
		{"build", "-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"},
	} {
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	}
	t.Logf("built api, relay, attachment-worker, webhook-dispatcher, demo and nats-server in %.1fs", time.Since(t0).Seconds())
	return binaries{
		api: filepath.Join(dir, "api"), relay: filepath.Join(dir, "relay"),
		worker: filepath.Join(dir, "attachment-worker"), dispatcher: filepath.Join(dir, "webhook-dispatcher"), demo: filepath.Join(dir, "demo"), nats: filepath.Join(dir, "nats-server"),
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// taken below the kernel's ephemeral range when it can be: the suite
// restarts servers on their ports (NATS after 20 s down, PostgreSQL, the
// programs after a kill), and a port from the ephemeral range could be
// taken meanwhile by any outgoing connection on the machine.
func freePort(t *testing.T) int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	portMu.Lock()
	defer portMu.Unlock()
	if low > 12000 {
		for range 200 {
			p := 10000 + mrand.IntN(low-10000)
			if usedPorts[p] {
				continue
			}
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				continue
			}
			ln.Close()
			usedPorts[p] = true
			return p
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

var (
	portMu    sync.Mutex
	usedPorts = map[int]bool{} // handed out in this process
)

// cleanEnv is the suite's environment without the settings of the
// programs under test, so that nothing from the caller's shell leaks in.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || k == "NATS_URL" || strings.HasPrefix(k, "QUILL_") || strings.HasPrefix(k, "PG") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// --- PostgreSQL --------------------------------------------------------------

// pgCluster is a private PostgreSQL cluster made with initdb in a temporary
// directory, listening on its own port on 127.0.0.1 (TCP only). It never
// touches the machine's shared server.
type pgCluster struct {
	bindir, base, data, logFile string
	port                        int
	cred                        *syscall.Credential // set when the suite runs as root
}

// findPGBin returns the bin directory of the newest PostgreSQL under
// /usr/lib/postgresql, or "".
func findPGBin() string {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	best, bestVer := "", -1
	for _, m := range matches {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m))))
		if err == nil && v > bestVer {
			best, bestVer = filepath.Dir(m), v
		}
	}
	return best
}

// startPostgres creates and starts a private cluster, or skips the test
// when no PostgreSQL server binaries are installed. It is stopped and
// removed when t ends (kept with QUILL_E2E_KEEP=1).
func startPostgres(t *testing.T) *pgCluster {
	t.Helper()
	bindir := findPGBin()
	if bindir == "" {
		t.Skip("e2e: no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (install the postgresql package); the fault suite needs a private cluster it can restart")
	}
	c := &pgCluster{bindir: bindir, port: freePort(t)}
	var uid, gid int = -1, -1
	if os.Geteuid() == 0 {
		// The server refuses to run as root: run the cluster as postgres.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("e2e: running as root and there is no postgres user to run a private PostgreSQL cluster as")
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	base, err := os.MkdirTemp("", "quill-e2e-pg-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o755))
	if uid >= 0 {
		require.NoError(t, os.Chown(base, uid, gid))
	}
	c.base, c.data, c.logFile = base, filepath.Join(base, "data"), filepath.Join(base, "postgres.log")
	t.Cleanup(func() {
		_ = c.pgctl(context.Background(), "-m", "immediate", "stop")
		if os.Getenv("QUILL_E2E_KEEP") == "" {
			os.RemoveAll(base)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := c.command(ctx, filepath.Join(bindir, "initdb"), "-D", c.data, "--auth=trust", "-U", "postgres",
		"-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput()
	require.NoError(t, err, "initdb:\n%s", out)
	require.NoError(t, c.pgctl(ctx, "start"), "pg_ctl start; log:\n%s", tail(c.logFile, 20))
	return c
}

func (c *pgCluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(cleanEnv(), "LC_ALL=C")
	cmd.Dir = c.base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	return cmd
}

// serverOptions: TCP on 127.0.0.1 only (no socket in /var/run/postgresql),
// and no fsync — every restart is a clean (fast) shutdown, which flushes.
func (c *pgCluster) serverOptions() string {
	return fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off -c max_connections=200", c.port)
}

// pgctl runs pg_ctl with action (start, stop, restart) and waits for it.
func (c *pgCluster) pgctl(ctx context.Context, args ...string) error {
	action := args[len(args)-1]
	all := []string{"-D", c.data, "-w", "-t", "120"}
	if action == "start" || action == "restart" {
		all = append(all, "-l", c.logFile, "-o", c.serverOptions())
	}
	all = append(all, args...)
	out, err := c.command(ctx, filepath.Join(c.bindir, "pg_ctl"), all...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Restart is `pg_ctl -m fast restart`: sessions are ended, the server
// checkpoints and comes back on the same port.
func (c *pgCluster) Restart(ctx context.Context) error { return c.pgctl(ctx, "-m", "fast", "restart") }

// URL returns the URL of database db on the cluster.
func (c *pgCluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// StartTime returns pg_postmaster_start_time(), which changes with every
// restart.
func (c *pgCluster) StartTime(ctx context.Context) (time.Time, error) {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ts time.Time
	err = conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&ts)
	return ts, err
}

// --- NATS --------------------------------------------------------------------

// natsServer is a nats-server process with JetStream on a fixed port and
// store directory, so that a stop and a start bring back the same server
// with its streams and consumers.
type natsServer struct {
	bin, store, logFile string
	port                int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	pids []int
}

func startNATS(t *testing.T, bin, dir string) *natsServer {
	t.Helper()
	n := &natsServer{bin: bin, store: filepath.Join(dir, "nats-store"), logFile: filepath.Join(dir, "nats-server.log"), port: freePort(t)}
	t.Cleanup(func() { _ = n.Stop(10 * time.Second) })
	require.NoError(t, n.Start(t.Context()))
	return n
}

// URL is the client URL; it does not change across restarts.
func (n *natsServer) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// Start starts the server and waits until JetStream answers.
func (n *natsServer) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return errors.New("nats-server already running")
	}
	logf, err := os.OpenFile(n.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== e2e: nats-server start at %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(n.bin, "-js", "-sd", n.store, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-n", "quill-e2e")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	n.cmd, n.done = cmd, done
	n.pids = append(n.pids, cmd.Process.Pid)
	deadline := time.Now().Add(60 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := natstest.Probe(pctx, n.URL())
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			n.cmd = nil
			return fmt.Errorf("nats-server exited at start-up; log:\n%s", tail(n.logFile, 10))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nats-server not ready: %w", err)
		}
		// A poll with a deadline: it returns an error rather than using
		// testkit.WaitFor, which fails the test, because the chaos
		// goroutine calls it too.
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the server (SIGTERM: a clean shutdown that flushes the store)
// and waits for it, killing it after timeout.
func (n *natsServer) Stop(timeout time.Duration) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(timeout):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
	return nil
}

// Running reports whether the server process is up.
func (n *natsServer) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// --- the daemons under test --------------------------------------------------

// exitRecord is one incarnation's end.
type exitRecord struct {
	Incarnation int
	Killed      bool // by the suite's SIGKILL (the signal ended it)
	Stopped     bool // by the suite's final stop
	Healthy     bool // its /healthz had answered before it ended
	Status      string
	Uptime      time.Duration
}

// daemon supervises one program: it starts it, restarts it whenever it
// ends (like a process supervisor would: at once after a kill, after a
// second after a failure), and kills it on request. Every incarnation
// appends to one log file.
type daemon struct {
	// name is unique in a run (its log, its scrapes); role is the program
	// (api, relay, attachment-worker), which several daemons may share.
	name, role, bin, adminAddr, logFile string
	args, env                           []string

	mu        sync.Mutex
	inc       int
	cmd       *exec.Cmd
	exited    chan struct{} // closed when the current incarnation ended
	started   time.Time
	healthy   bool
	killing   bool
	stopping  bool
	exits     []exitRecord
	kills     int
	firstUp   chan struct{}
	firstOnce sync.Once
	loopDone  chan struct{}
}

func newDaemon(name, bin, adminAddr, logFile string, env []string, args ...string) *daemon {
	return &daemon{name: name, role: name, bin: bin, adminAddr: adminAddr, logFile: logFile, env: env, args: args,
		firstUp: make(chan struct{}), loopDone: make(chan struct{})}
}

// Run supervises until Stop. Call it in a goroutine.
func (d *daemon) Run() {
	defer close(d.loopDone)
	for {
		d.mu.Lock()
		if d.stopping {
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		failed := d.once()
		d.mu.Lock()
		stopping := d.stopping
		d.mu.Unlock()
		if stopping {
			return
		}
		delay := 300 * time.Millisecond
		if failed {
			delay = time.Second
		}
		time.Sleep(delay) // the supervisor's pause before a restart, not a wait
	}
}

// once runs one incarnation to its end; it reports whether it failed on
// its own (rather than being killed by the suite).
func (d *daemon) once() bool {
	logf, err := os.OpenFile(d.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return true
	}
	defer logf.Close()
	d.mu.Lock()
	d.inc++
	inc := d.inc
	fmt.Fprintf(logf, "=== e2e: %s incarnation %d start at %s\n", d.name, inc, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(d.bin, d.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = d.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		d.mu.Unlock()
		fmt.Fprintf(logf, "=== e2e: start failed: %v\n", err)
		return true
	}
	exited := make(chan struct{})
	d.cmd, d.exited, d.started, d.healthy, d.killing = cmd, exited, time.Now(), false, false
	d.mu.Unlock()

	go d.watchHealth(inc, exited)
	werr := cmd.Wait()

	d.mu.Lock()
	// exited is closed once the end is recorded: Kill reads the record as
	// soon as it sees exited closed.
	defer close(exited)
	defer d.mu.Unlock()
	rec := exitRecord{Incarnation: inc, Healthy: d.healthy, Uptime: time.Since(d.started), Status: "exit status 0"}
	if werr != nil {
		rec.Status = werr.Error()
	}
	// A kill counts only if the signal ended the process: one that was
	// already exiting on its own (a start-up failure) was not killed.
	rec.Killed = d.killing && !d.stopping && rec.Status == "signal: killed"
	rec.Stopped = d.stopping
	if rec.Killed {
		d.kills++
	}
	d.exits = append(d.exits, rec)
	d.cmd = nil
	fmt.Fprintf(logf, "=== e2e: %s incarnation %d ended after %s: %s (killed by the suite: %t)\n", d.name, inc, rec.Uptime.Round(time.Millisecond), rec.Status, rec.Killed)
	return !rec.Killed
}

// watchHealth polls /healthz until it answers or the incarnation ends.
func (d *daemon) watchHealth(inc int, exited <-chan struct{}) {
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			return
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get("http://" + d.adminAddr + "/healthz")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			d.mu.Lock()
			if d.inc == inc && d.cmd != nil {
				d.healthy = true
			}
			d.mu.Unlock()
			d.firstOnce.Do(func() { close(d.firstUp) })
			return
		}
	}
}

// Current returns the running incarnation's number, or 0 while none runs.
func (d *daemon) Current() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return 0
	}
	return d.inc
}

// Healthy reports whether an incarnation runs and has answered /healthz.
func (d *daemon) Healthy() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd != nil && d.healthy
}

// Kill sends SIGKILL to the running incarnation and waits until it ended;
// the supervisor starts the next one. While none runs (between restarts,
// or while one fails at start-up because a dependency is down) it waits for
// the next, up to timeout, and it tries again when its signal met a
// process already exiting on its own. It reports the killed incarnation (0:
// none within timeout).
func (d *daemon) Kill(timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		d.mu.Lock()
		if d.cmd == nil || d.stopping {
			d.mu.Unlock()
			// Polls for the next incarnation, off the test goroutine
			// (the chaos schedule kills): testkit.WaitFor would fail
			// the test from there.
			time.Sleep(20 * time.Millisecond)
			continue
		}
		d.killing = true
		cmd, exited, inc := d.cmd, d.exited, d.inc
		d.mu.Unlock()
		_ = cmd.Process.Kill()
		<-exited
		d.mu.Lock()
		killed := len(d.exits) > 0 && d.exits[len(d.exits)-1].Incarnation == inc && d.exits[len(d.exits)-1].Killed
		d.mu.Unlock()
		if killed {
			return inc
		}
	}
	return 0
}

// Stop ends supervision and the running incarnation (SIGTERM, then
// SIGKILL after timeout). It returns that incarnation's end, or nil when
// none was running.
func (d *daemon) Stop(timeout time.Duration) *exitRecord {
	d.mu.Lock()
	d.stopping = true
	cmd, exited, inc := d.cmd, d.exited, d.inc
	d.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(timeout):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	<-d.loopDone
	if cmd == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.exits) - 1; i >= 0; i-- {
		if d.exits[i].Incarnation == inc {
			e := d.exits[i]
			return &e
		}
	}
	return nil
}

// WaitHealthy waits until an incarnation answers /healthz.
func (d *daemon) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !d.Healthy() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not healthy within %s; log:\n%s", d.name, timeout, tail(d.logFile, 15))
		}
		// A poll with a deadline, not testkit.WaitFor: its error carries
		// the log's tail as it is at the deadline.
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// Exits returns every incarnation's end so far, and the suite's kills.
func (d *daemon) Exits() ([]exitRecord, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.exits), d.kills
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// grepFile returns the lines of path that contain any of needles (at most
// limit of them).
func grepFile(path string, limit int, needles ...string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		for _, n := range needles {
			if bytes.Contains(line, []byte(n)) {
				out = append(out, strings.TrimRight(string(line), "\n"))
				break
			}
		}
		if err != nil || len(out) >= limit {
			if !errors.Is(err, io.EOF) && err != nil {
				out = append(out, "(read error: "+err.Error()+")")
			}
			return out
		}
	}
}
