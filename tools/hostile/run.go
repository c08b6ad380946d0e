package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/wait"
)

// Defaults of the flags: the workload, with short phases.
const (
	defaultURL              = "http://127.0.0.1:8080"
	defaultDatabaseURL      = "postgres://postgres@127.0.0.1:5432/quill_bench_hostile?sslmode=disable"
	defaultDuration         = 20 * time.Second
	defaultWarmup           = 3 * time.Second
	defaultTimeout          = 10 * time.Second
	defaultRecover          = 30 * time.Second
	defaultDrain            = 30 * time.Second
	defaultLegitClients     = 16
	defaultResendShare      = 0.2
	defaultAttachShare      = 0.5
	defaultSlowloris        = 200
	defaultBadTokenRate     = 500
	defaultTenantConcurrent = 32
	defaultFloodFactor      = 10
	// defaultFloodPause is how long a flooding client waits after a
	// non-2xx: an attacker ignores Retry-After, but a tool spinning on
	// instant 429s would take the cores the API needs on a small machine.
	defaultFloodPause = 20 * time.Millisecond
	defaultBombRate   = 1
	// defaultInventedRate and defaultIdleConns are issue 24's attackers:
	// invented methods a second, and one host's idle connections to each
	// server (more than QUILL_MAX_CONNECTIONS, 1024, as in its review).
	defaultInventedRate = 200
	defaultIdleConns    = 1100
	// maxIdleConns bounds --idle-conns: each is a descriptor of the
	// attackers' process and an ephemeral port of one source address.
	maxIdleConns        = 20000
	defaultDecodeBudget = 268435456
	defaultLegitTenant  = "legit"
	defaultBombTenant   = "bomber"
	defaultFloodTenant  = "flood"
	// notesPath is where every create and list goes.
	notesPath = "/v1/notes"
	// drainPoll is how often the drain looks at the attachments.
	drainPoll = 500 * time.Millisecond
)

// config is one run's settings.
type config struct {
	url, databaseURL string
	// adminURL is the API's admin server: its /metrics is scraped, its
	// /healthz probed and the idle host holds connections to it too (""
	// for none of these).
	adminURL string
	// ownAddrs: the servers are on IPv4 loopback, so each client
	// connects from a loopback address of its own (addrs.go).
	ownAddrs                        bool
	legitTokens                     []string // client w uses legitTokens[w % len]
	legitTenants                    []string // the tenants of legitTokens, in order
	floodToken, bombToken           string
	bombTenant                      string
	floodTenant                     string
	apiPID, workerPID               int
	cpuPIDs                         map[string]int // processes whose CPU is reported
	duration, warmup, timeout       time.Duration
	recover, drain                  time.Duration
	floodPause                      time.Duration
	legitClients                    int
	legitThink                      time.Duration
	resendShare, attachShare        float64
	slowloris                       int
	badTokenRate, bombRate          float64
	inventedRate                    float64
	idleConns                       int
	tenantConcurrency, floodFactor  int
	decodeBudget                    int64
	runID                           string
	seed                            uint64
	noteAPI, noteWorker, noteAttack string
	// attackChild: this process is the attackers' (attackers.go);
	// attackWrap: the command the parent starts it behind (a CPU cap).
	attackChild bool
	attackWrap  string
}

func (c config) notesURL() string { return strings.TrimRight(c.url, "/") + notesPath }

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("hostile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: hostile --token T --flood-token T --bomb-token T [flags]\n\n"+
			"Runs a legitimate agent workload alone, then beside slowloris connections, bad tokens, a\n"+
			"flooding tenant and image bombs, checks the legitimate operations in PostgreSQL and prints\n"+
			"the two runs side by side (make bench-hostile; see bench/README.md).\n\nFlags:")
		fs.PrintDefaults()
	}
	envOr := cli.EnvOr(getenv)
	fs.StringVar(&c.url, "url", envOr("QUILL_URL", defaultURL), "API base URL (env QUILL_URL)")
	fs.StringVar(&c.adminURL, "admin-url", "", "the API's admin server (its QUILL_ADMIN_ADDR as a URL): /metrics is scraped for the series counts, /healthz probed, and the idle host holds connections to it too (empty: none of these)")
	fs.StringVar(&c.databaseURL, "database-url", envOr("DATABASE_URL", defaultDatabaseURL), "the API's database, where the legitimate notes are checked (env DATABASE_URL)")
	var legitTokens, legitTenants string
	fs.StringVar(&legitTokens, "token", getenv("QUILL_TOKEN"), "the legitimate tenants' tokens, comma-separated: client w uses the (w mod n)th (env QUILL_TOKEN)")
	fs.StringVar(&c.floodToken, "flood-token", "", "the flooding tenant's token")
	fs.StringVar(&c.bombToken, "bomb-token", "", "the token the image bombs are sent with")
	fs.StringVar(&legitTenants, "legit-tenant", defaultLegitTenant, "the tenants of --token's tokens, comma-separated, in the same order")
	fs.StringVar(&c.bombTenant, "bomb-tenant", defaultBombTenant, "the tenant of --bomb-token")
	fs.StringVar(&c.floodTenant, "flood-tenant", defaultFloodTenant, "the tenant of --flood-token (for the report)")
	fs.IntVar(&c.apiPID, "api-pid", 0, "the API's pid: its peak RSS (VmHWM) per phase (0: not measured)")
	fs.IntVar(&c.workerPID, "worker-pid", 0, "the attachment worker's pid, likewise")
	fs.DurationVar(&c.duration, "duration", defaultDuration, "measured time of each phase, after its warmup")
	fs.DurationVar(&c.warmup, "warmup", defaultWarmup, "unmeasured start of each phase (the attackers start with it)")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "per-request timeout")
	fs.DurationVar(&c.recover, "recover", defaultRecover, "after the phases, how long the creates left without a 2xx are resent")
	fs.DurationVar(&c.drain, "drain", defaultDrain, "after each phase, how long to wait for the worker to process every pending attachment")
	fs.IntVar(&c.legitClients, "legit-clients", defaultLegitClients, "legitimate clients, each one request at a time")
	fs.DurationVar(&c.legitThink, "legit-think", 0, "how long each legitimate client waits after an answer before its next request, as an agent thinks (0: none, every client sends back to back)")
	fs.Float64Var(&c.resendShare, "resend-share", defaultResendShare, "share of the legitimate operations that resend an earlier create (0-1)")
	fs.Float64Var(&c.attachShare, "attach-share", defaultAttachShare, "share of the legitimate creates with a 64 KiB PNG attachment (0-1)")
	fs.IntVar(&c.slowloris, "slowloris", defaultSlowloris, "slowloris connections held open in the hostile phase (0: none)")
	fs.Float64Var(&c.badTokenRate, "bad-token-rate", defaultBadTokenRate, "requests per second with random well-formed tokens in the hostile phase (0: none)")
	fs.IntVar(&c.tenantConcurrency, "tenant-concurrency", defaultTenantConcurrent, "the API's QUILL_TENANT_CONCURRENCY, which the flood exceeds")
	fs.IntVar(&c.floodFactor, "flood-factor", defaultFloodFactor, "the flooding tenant's concurrent creates, as a multiple of --tenant-concurrency (0: no flood)")
	fs.DurationVar(&c.floodPause, "flood-pause", defaultFloodPause, "how long a flooding client waits after a non-2xx answer (it ignores Retry-After)")
	fs.Float64Var(&c.inventedRate, "invented-method-rate", defaultInventedRate, "requests per second with a fresh invented HTTP method (one in four 60 KiB long) and no token, to /v1/notes and to unmatched paths, in the hostile phase (0: none)")
	fs.IntVar(&c.idleConns, "idle-conns", defaultIdleConns, "connections one host holds idle to the API (and to --admin-url) in the hostile phase, half after one request, half sending nothing; reopened when the server closes them (0: none)")
	fs.Float64Var(&c.bombRate, "bomb-rate", defaultBombRate, "image bombs uploaded per second in the hostile phase (0: none)")
	fs.Int64Var(&c.decodeBudget, "decode-budget", defaultDecodeBudget, "the worker's QUILL_WORKER_DECODE_MEMORY in bytes: its RSS target is this + 128 MiB")
	fs.StringVar(&c.noteAPI, "api-note", "", "a line about the API's settings, printed in the report")
	fs.StringVar(&c.noteWorker, "worker-note", "", "a line about the worker's settings, printed in the report")
	fs.StringVar(&c.noteAttack, "attack-note", "", "a line about the attackers' process (its CPU cap), printed in the report")
	fs.StringVar(&c.attackWrap, "attack-wrap", "", "a command (split at spaces) the attackers' process is started behind, such as a script that puts it under a CPU cap and execs its arguments")
	fs.Var(pidValue{&c.cpuPIDs}, "cpu-pid", "NAME=PID of a process whose CPU use per phase is reported (repeatable; PostgreSQL's processes, the tool and the attackers are always reported)")
	fs.BoolVar(&c.attackChild, "attack-child", false, "internal: be the attackers' process (started by the tool itself)")
	fs.StringVar(&c.runID, "run-id", "", "internal: the run id the attackers' process shares with the tool")
	if err := cli.ParseFlags(fs, args); err != nil {
		return c, err
	}
	c.legitTokens, c.legitTenants = splitList(legitTokens), splitList(legitTenants)
	if c.cpuPIDs == nil {
		c.cpuPIDs = map[string]int{}
	}
	if err := c.validate(); err != nil {
		return c, cli.UsageError{Msg: err.Error()}
	}
	c.ownAddrs = loopbackV4(c.url) && (c.adminURL == "" || loopbackV4(c.adminURL))
	var b [14]byte
	if _, err := rand.Read(b[:]); err != nil {
		return c, fmt.Errorf("random run id: %w", err)
	}
	if c.runID == "" {
		c.runID = "h-" + hex.EncodeToString(b[:6])
	}
	c.seed = binary.LittleEndian.Uint64(b[6:])
	return c, nil
}

// validate names the first bad setting.
func (c config) validate() error {
	u, err := url.Parse(c.url)
	var adminErr error
	if c.adminURL != "" {
		a, err := url.Parse(c.adminURL)
		if err != nil || (a.Scheme != "http" && a.Scheme != "https") || a.Host == "" {
			adminErr = fmt.Errorf("--admin-url %q is not an http(s) URL such as http://127.0.0.1:9091", c.adminURL)
		}
	}
	share := func(v float64) bool { return v >= 0 && v <= 1 }
	rate := func(v float64) bool { return v >= 0 && v <= 1e6 }
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("--url %q is not an http(s) URL such as %s", c.url, defaultURL)
	case adminErr != nil:
		return adminErr
	case len(c.legitTokens) == 0 || c.floodToken == "" || c.bombToken == "":
		return errors.New("--token (or QUILL_TOKEN), --flood-token and --bomb-token are required; create them with: api token create --tenant T")
	case len(c.legitTenants) != len(c.legitTokens):
		return fmt.Errorf("--legit-tenant names %d tenants for the %d tokens of --token: name each token's tenant, in order", len(c.legitTenants), len(c.legitTokens))
	case len(c.legitTokens) > c.legitClients:
		return fmt.Errorf("--token has %d tokens for %d --legit-clients: each legitimate tenant needs at least one client", len(c.legitTokens), c.legitClients)
	case c.duration <= 0 || c.warmup < 0 || c.timeout <= 0 || c.recover < 0 || c.drain < 0 || c.floodPause < 0 || c.legitThink < 0:
		return errors.New("--duration and --timeout must be positive; --warmup, --recover, --drain, --flood-pause and --legit-think not negative")
	case c.legitClients < 1:
		return errors.New("--legit-clients must be at least 1")
	case !share(c.resendShare) || !share(c.attachShare):
		return errors.New("--resend-share and --attach-share must be between 0 and 1")
	case c.slowloris < 0 || c.floodFactor < 0 || c.tenantConcurrency < 1:
		return errors.New("--slowloris and --flood-factor must not be negative, --tenant-concurrency at least 1")
	case !rate(c.badTokenRate) || !rate(c.bombRate) || !rate(c.inventedRate):
		return errors.New("--bad-token-rate, --bomb-rate and --invented-method-rate must be between 0 and 1000000 per second")
	case c.idleConns < 0 || c.idleConns > maxIdleConns:
		return fmt.Errorf("--idle-conns must be from 0 to %d", maxIdleConns)
	case c.decodeBudget < 1:
		return errors.New("--decode-budget must be a positive number of bytes")
	case c.apiPID < 0 || c.workerPID < 0:
		return errors.New("--api-pid and --worker-pid must not be negative")
	}
	return nil
}

// run is the whole program: main only wires signals and the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if cli.AsksVersion(args) {
		cli.PrintVersion("hostile", stdout)
		return nil
	}
	c, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	if c.attackChild {
		return runAttackChild(ctx, c, os.Stdin, stdout)
	}
	db, err := pgx.Connect(ctx, c.databaseURL)
	if err != nil {
		return fmt.Errorf("connect to the database: %w", err)
	}
	defer db.Close(context.WithoutCancel(ctx))

	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "hostile: "+format+"\n", a...) }
	if err := checkTokens(ctx, c); err != nil {
		return err
	}
	// The attackers' process starts now, so that making the bomb (~1.5 s)
	// is not in a phase and a child that cannot start stops the run early.
	atk, err := startAttackChild(ctx, c, args, stderr)
	if err != nil {
		return err
	}
	c.cpuPIDs["attackers"] = atk.pid()
	c.cpuPIDs["tool (legitimate clients)"] = os.Getpid()
	attackStarted := false
	defer func() {
		if !attackStarted {
			_ = atk.stdin.Close()
			_ = atk.cmd.Wait()
		}
	}()
	l := newLegit(c)
	rep := report{cfg: c}

	logf("quiet phase: %d legitimate clients in %d tenants, %s warmup + %s", c.legitClients, len(c.legitTenants), c.warmup, c.duration)
	var drainErr error
	rep.quiet = phase(ctx, c, func(ctx context.Context) legitPhase { return l.run(ctx, "q") }, func() {
		logf("waiting up to %s for the quiet phase's attachments", c.drain)
		rep.quietDrain, drainErr = drain(ctx, db, time.Now().Add(c.drain))
	})
	if drainErr != nil {
		return drainErr
	}

	logf("hostile phase: the same beside %d slowloris connections, %g bad tokens/s, %d flooding creates, %g bombs/s, %g invented methods/s, %d idle connections",
		c.slowloris, c.badTokenRate, c.tenantConcurrency*c.floodFactor, c.bombRate, c.inventedRate, c.idleConns)
	if err := atk.start(); err != nil {
		return fmt.Errorf("start the attack: %w", err)
	}
	attackStarted = true
	var atkErr error
	// The peaks cover the drain too: the bombs sent during the phase are
	// decoded when the worker reaches them, often after it.
	rep.hostile = phase(ctx, c, func(ctx context.Context) legitPhase { return l.run(ctx, "h") }, func() {
		rep.attack, atkErr = atk.stop()
		logf("resending the creates left without a 2xx (up to %s)", c.recover)
		rep.recovered, _ = l.recover(ctx, time.Now().Add(c.recover))
		logf("waiting up to %s for every attachment, the bombs' too", c.drain)
		rep.hostileDrain, drainErr = drain(ctx, db, time.Now().Add(c.drain))
	})
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if atkErr != nil {
		return atkErr
	}
	if drainErr != nil {
		return drainErr
	}
	if rep.attach, err = attachmentStates(ctx, db, c.legitTenants); err != nil {
		return err
	}
	found, strays, err := legitNotes(ctx, db, c.legitTenants)
	if err != nil {
		return err
	}
	rep.integrity = check(l.ops, found, strays)
	if c.bombRate > 0 {
		if rep.bombOutcome, err = attachmentStates(ctx, db, []string{c.bombTenant}); err != nil {
			return err
		}
	}
	rep.write(stdout)
	return nil
}

// checkTokens lists one note with every token the run uses, so that a bad
// token stops the run before it starts, and so that the API has seen each
// valid once: under the bad-token attack the lookups of tokens not known
// valid are bounded across all addresses (4 at once, 429 past it), and a
// token first seen then would wait behind the attack's lookups, which is
// the attack's, not the tenant's, doing.
func checkTokens(ctx context.Context, c config) error {
	hc := newHTTPClient(c.dialer(fromLegit), 1, c.timeout)
	defer hc.CloseIdleConnections()
	toks := append(slices.Clone(c.legitTokens), c.floodToken, c.bombToken)
	names := append(slices.Clone(c.legitTenants), c.floodTenant, c.bombTenant)
	for i, tok := range toks {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.notesURL()+"?limit=1", nil)
		if err != nil {
			return fmt.Errorf("check the tokens: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		if a := do(hc, req); a.kind() != "2xx" {
			return fmt.Errorf("the token of tenant %s was answered %s by GET %s: create tokens with: api token create --tenant T", names[i], a.kind(), notesPath)
		}
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// pidValue is a repeatable NAME=PID flag.
type pidValue struct{ m *map[string]int }

func (p pidValue) String() string { return "" }

func (p pidValue) Set(v string) error {
	name, pid, ok := strings.Cut(v, "=")
	n, err := strconv.Atoi(pid)
	if !ok || name == "" || err != nil || n < 1 {
		return fmt.Errorf("%q is not NAME=PID with a positive PID", v)
	}
	if *p.m == nil {
		*p.m = map[string]int{}
	}
	(*p.m)[name] = n
	return nil
}

// phaseResult is one phase: the legitimate figures and the peaks.
type phaseResult struct {
	legit       legitPhase
	api, worker peak
	// cpu is the cores each process used over the measured window.
	cpu cpuUse
	// start and end are the API's series at the measured window's start
	// and end; probe the health probe over the whole phase (both only
	// with --admin-url).
	start, end series
	probe      probeStats
}

// phase runs the legitimate workload once and then after, while watching
// the processes' peak RSS over both, and with --admin-url probing the
// API's /healthz during the workload and counting its series at the
// measured window's start and end.
func phase(ctx context.Context, c config, legit func(context.Context) legitPhase, after func()) phaseResult {
	wctx, stop := context.WithCancel(ctx)
	apiPeak, workerPeak := watchRSS(wctx, c.apiPID), watchRSS(wctx, c.workerPID)
	admin := c.adminURL != ""
	hc := newHTTPClient(c.dialer(fromProbe), 1, probeTimeout)
	hc.Transport.(*http.Transport).DisableKeepAlives = true
	sc := newHTTPClient(c.dialer(fromProbe), 1, scrapeTimeout)
	defer sc.CloseIdleConnections()
	pctx, stopProbe := context.WithCancel(ctx)
	probed := make(chan probeStats, 1)
	if admin {
		go func() { probed <- probe(pctx, hc, strings.TrimRight(c.adminURL, "/")+"/healthz") }()
	}
	// The CPU window is the legitimate clients' measured one: from the
	// warmup's end to the end of legit.
	from := make(chan cpuTimes, 1)
	start := make(chan series, 1)
	t := time.AfterFunc(c.warmup, func() {
		from <- readCPU(c.cpuPIDs)
		if admin {
			start <- scrape(ctx, sc, c.adminURL, c.apiPID)
		}
	})
	r := phaseResult{legit: legit(ctx)}
	to := readCPU(c.cpuPIDs)
	if admin {
		r.end = scrape(ctx, sc, c.adminURL, c.apiPID)
	}
	stopProbe()
	if t.Stop() {
		close(from) // the phase ended within its warmup: no window
		r.start = series{Err: "the phase ended within its warmup"}
	} else {
		r.cpu = to.since(<-from)
		if admin {
			r.start = <-start
		}
	}
	if admin {
		r.probe = <-probed
	}
	after()
	stop()
	r.api, r.worker = apiPeak(), workerPeak()
	return r
}

// legitNotes returns the legitimate tenant's live notes by the key in
// their title, and how many notes it has without such a title.
func legitNotes(ctx context.Context, db *pgx.Conn, tenants []string) (keyNotes, int, error) {
	rows, err := db.Query(ctx, `SELECT title, id::text FROM notes WHERE tenant = ANY($1) AND deleted_at IS NULL`, tenants)
	if err != nil {
		return nil, 0, fmt.Errorf("read the legitimate notes: %w", err)
	}
	defer rows.Close()
	found, strays := keyNotes{}, 0
	for rows.Next() {
		var title, id string
		if err := rows.Scan(&title, &id); err != nil {
			return nil, 0, fmt.Errorf("read the legitimate notes: %w", err)
		}
		key, ok := strings.CutPrefix(title, legitTitlePrefix)
		if !ok {
			strays++
			continue
		}
		found[key] = append(found[key], id)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("read the legitimate notes: %w", err)
	}
	return found, strays, nil
}

// states counts attachments by status; reasons the failures' reasons.
type states struct {
	byStatus counts
	reasons  counts
}

// attachmentStates counts the tenants' attachments by status, and the
// failed ones by reason.
func attachmentStates(ctx context.Context, db *pgx.Conn, tenants []string) (states, error) {
	tenant := strings.Join(tenants, ", ")
	s := states{byStatus: counts{}, reasons: counts{}}
	rows, err := db.Query(ctx, `SELECT status, coalesce(reason, ''), count(*) FROM attachments WHERE tenant = ANY($1) GROUP BY 1, 2`, tenants)
	if err != nil {
		return s, fmt.Errorf("count the attachments of %s: %w", tenant, err)
	}
	defer rows.Close()
	for rows.Next() {
		var status, reason string
		var n int
		if err := rows.Scan(&status, &reason, &n); err != nil {
			return s, fmt.Errorf("count the attachments of %s: %w", tenant, err)
		}
		s.byStatus[status] += n
		if status == "failed" {
			s.reasons[reason] += n
		}
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("count the attachments of %s: %w", tenant, err)
	}
	return s, nil
}

// drained is how a wait for the worker ended.
type drained struct {
	// Pending is the attachments of every tenant still pending then.
	Pending int
	WaitedS float64
}

// drain waits until no attachment of any tenant is pending, or until has
// passed.
func drain(ctx context.Context, db *pgx.Conn, until time.Time) (drained, error) {
	t0 := time.Now()
	for {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM attachments WHERE status = 'pending'`).Scan(&n); err != nil {
			return drained{}, fmt.Errorf("count the pending attachments: %w", err)
		}
		if n == 0 || !time.Now().Add(drainPoll).Before(until) {
			return drained{Pending: n, WaitedS: measure.Round(time.Since(t0).Seconds(), 1)}, nil
		}
		if !wait.For(ctx, drainPoll) {
			return drained{}, ctx.Err()
		}
	}
}
