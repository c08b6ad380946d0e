package systemd_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/dispatch"
	"github.com/quillhq/quill/internal/relay"
)

// binDir holds the programs the units run, built once by TestMain.
var binDir string

// TestMain builds api, relay, attachment-worker and webhook-dispatcher, as
// the units run them,
// and fails the package if a test leaves a goroutine behind. With mdweEnv
// set, the test binary is a launcher instead (mdweExec).
func TestMain(m *testing.M) {
	if os.Getenv(mdweEnv) == "1" {
		os.Exit(mdweExec(os.Args[1:]))
	}
	dir, err := os.MkdirTemp("", "quill-units")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/api", "./cmd/relay", "./cmd/attachment-worker", "./cmd/webhook-dispatcher")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the programs: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// mdweEnv makes the test binary deny itself memory that is writable and
// executable, as MemoryDenyWriteExecute=yes does, and then execute the
// program its arguments name, which keeps the restriction: so the tests
// run the units' programs as the units do.
const mdweEnv = "QUILL_TEST_MDWE_EXEC"

// prctl's PR_SET_MDWE and its PR_MDWE_REFUSE_EXEC_GAIN (Linux 6.3).
const (
	prSetMDWE            = 0x41
	prMDWERefuseExecGain = 0x1
)

// mdweExec applies PR_SET_MDWE, says on stderr whether the kernel has it,
// and executes args. It returns only when the exec fails.
func mdweExec(args []string) int {
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetMDWE, prMDWERefuseExecGain, 0, 0, 0, 0); errno != 0 {
		fmt.Fprintf(os.Stderr, "mdwe: not applied (%v): the kernel predates PR_SET_MDWE\n", errno)
	} else {
		fmt.Fprintln(os.Stderr, "mdwe: applied")
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, mdweEnv+"=") })
	err := syscall.Exec(args[0], args, env)
	fmt.Fprintln(os.Stderr, "exec:", err)
	return 1
}

// installedBin is where the units expect the programs (the Dockerfile's
// place for them too).
const installedBin = "/usr/local/bin/"

// A unit the package ships: the program and command its ExecStart runs,
// and that program's own shutdown grace with the default settings, which
// TimeoutStopSec must exceed so that systemd never kills a shutdown that
// is going as designed.
type shipped struct {
	file      string
	prog, cmd string
	daemon    bool
	grace     time.Duration
}

var units = []shipped{
	{file: "quill-migrate.service", prog: "api", cmd: "migrate"},
	// In-flight requests get daemon.ShutdownTimeout (cmd/api serveHTTP).
	{file: "quill-api.service", prog: "api", cmd: "serve", daemon: true, grace: daemon.ShutdownTimeout},
	// A claim statement is bounded by the lease; then each batch's acks and
	// its marks by AckTimeout + Lease each (relay.awaitAcks, relay.settle).
	{file: "quill-relay.service", prog: "relay", cmd: "run", daemon: true,
		grace: relay.DefaultLease + 2*(relay.DefaultAckTimeout+relay.DefaultLease)},
	// The consumer's drain lets handlers finish for ShutdownTimeout, then
	// waits for the cancelled ones, then the router's close (5 s each at
	// most, consumer.Run); a put-off processing ends within a batch's
	// deadline, AckWait.
	{file: "quill-attachment-worker.service", prog: "attachment-worker", cmd: "run", daemon: true,
		grace: consumer.DefaultShutdownTimeout + 2*5*time.Second + consumer.DefaultAckWait},
	// The consumer's drain as the worker's, then the POSTs in flight, each
	// bounded by the timeout, and their marks (10 s each, dispatch's
	// markTimeout), which Run waits for after the consumer stopped.
	{file: "quill-webhook-dispatcher.service", prog: "webhook-dispatcher", cmd: "run", daemon: true,
		grace: consumer.DefaultShutdownTimeout + 2*5*time.Second + consumer.DefaultAckWait + dispatch.DefaultTimeout + 10*time.Second},
}

// The hardening every unit has, by key: the value of its last line, or for
// a key that accumulates (SystemCallFilter) every line's.
var hardening = map[string][]string{
	"DynamicUser":             {"yes"},
	"NoNewPrivileges":         {"yes"},
	"ProtectSystem":           {"strict"},
	"ProtectHome":             {"yes"},
	"PrivateTmp":              {"yes"},
	"PrivateDevices":          {"yes"},
	"PrivateUsers":            {"yes"},
	"ProtectKernelTunables":   {"yes"},
	"ProtectKernelModules":    {"yes"},
	"ProtectKernelLogs":       {"yes"},
	"ProtectControlGroups":    {"yes"},
	"RestrictAddressFamilies": {"AF_INET AF_INET6 AF_UNIX"},
	"RestrictNamespaces":      {"yes"},
	"RestrictSUIDSGID":        {"yes"},
	"LockPersonality":         {"yes"},
	"MemoryDenyWriteExecute":  {"yes"},
	"SystemCallArchitectures": {"native"},
	"SystemCallFilter":        {"@system-service", "~@privileged"},
	"CapabilityBoundingSet":   {""},
	"AmbientCapabilities":     {""},
}

// unit is a parsed unit file: its sections' assignments in order.
type unit map[string][]assignment

type assignment struct{ key, value string }

// parseUnit reads a unit file as systemd does for the subset the units
// use: [Section] lines, Key=Value lines, # and ; comments; a continued
// line (a trailing backslash) is refused, as the units have none.
func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	u, section := unit{}, ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case strings.HasSuffix(line, `\`):
			t.Fatalf("%s:%d: a continued line", path, n)
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "%s:%d: not an assignment: %q", path, n, line)
			require.NotEmpty(t, section, "%s:%d: an assignment outside a section", path, n)
			u[section] = append(u[section], assignment{strings.TrimSpace(k), strings.TrimSpace(v)})
		}
	}
	require.NoError(t, sc.Err())
	return u
}

// values returns every value of key in section, in order.
func (u unit) values(section, key string) []string {
	var vs []string
	for _, a := range u[section] {
		if a.key == key {
			vs = append(vs, a.value)
		}
	}
	return vs
}

// value returns the last value of key in section (the one systemd keeps),
// "" when there is none.
func (u unit) value(section, key string) string {
	vs := u.values(section, key)
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// timespan parses the systemd time spans the units use ("45s", "2min").
func timespan(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(strings.Replace(s, "min", "m", 1))
	require.NoError(t, err, "time span %q", s)
	return d
}

// TestUnits checks each unit against the program it runs: the command
// exists, the readiness protocol is the one the program speaks, the stop
// timeout exceeds the program's own grace, the hardening is there.
func TestUnits(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.service")
	require.NoError(t, err)
	var names []string
	for _, s := range units {
		names = append(names, s.file)
	}
	require.ElementsMatch(t, names, files, "every unit file is checked here")
	for _, s := range units {
		t.Run(s.file, func(t *testing.T) {
			t.Parallel()
			u := parseUnit(t, s.file)
			svc := func(key string) string { return u.value("Service", key) }

			require.Equal(t, installedBin+s.prog+" "+s.cmd, svc("ExecStart"))
			help, err := exec.Command(filepath.Join(binDir, s.prog), s.cmd, "--help").Output()
			require.NoError(t, err, "%s %s --help", s.prog, s.cmd)
			require.Regexp(t, `^usage: `+regexp.QuoteMeta(s.prog)+` \[?`+regexp.QuoteMeta(s.cmd)+`\b`, string(help), "the command exists")

			require.Equal(t, []string{"/etc/quill/quill.env", "-/etc/quill/" + strings.TrimSuffix(s.file, ".service") + ".env"}, u.values("Service", "EnvironmentFile"))
			require.Equal(t, strings.TrimSuffix(s.file, ".service"), svc("SyslogIdentifier"), "journalctl -t names the process")
			for key, want := range hardening {
				got := u.values("Service", key)
				if len(want) == 1 {
					require.Equal(t, want[0], svc(key), key)
				} else {
					require.Equal(t, want, got, key)
				}
			}
			require.Empty(t, u.values("Service", "ExecReload"), "nothing to reload: SIGHUP is ignored")

			if !s.daemon {
				require.Equal(t, "oneshot", svc("Type"))
				require.Equal(t, "yes", svc("RemainAfterExit"), "the daemons that Require it stay up")
				return
			}
			// The program sends READY=1 itself (daemon.NotifyReady); with
			// Type=simple or exec systemd would call it started at once.
			require.Equal(t, "notify", svc("Type"))
			require.Equal(t, "main", svc("NotifyAccess"))
			require.Equal(t, "SIGTERM", svc("KillSignal"))
			require.Equal(t, "on-failure", svc("Restart"))
			require.NotEmpty(t, svc("RestartSec"))
			stop := timespan(t, svc("TimeoutStopSec"))
			require.Greater(t, stop, s.grace, "TimeoutStopSec above the program's own grace")
			require.Contains(t, u.values("Unit", "Requires"), "quill-migrate.service")
			require.Contains(t, strings.Fields(strings.Join(u.values("Unit", "After"), " ")), "quill-migrate.service")
			require.Equal(t, "multi-user.target", u.value("Install", "WantedBy"))
		})
	}
}

// specSettings are SPEC §2's variables: those a unit's program reads must
// be in the example environment file, set or shown with their default.
var specSettings = []string{
	"DATABASE_URL", "NATS_URL", "QUILL_NATS_CREDS", "QUILL_NATS_TLS_CA", "QUILL_NATS_TLS_CERT", "QUILL_NATS_TLS_KEY",
	"QUILL_STREAM_REPLICAS", "QUILL_RELAY_DATABASE_URL", "QUILL_HTTP_ADDR", "QUILL_ADMIN_ADDR", "QUILL_STREAM",
	"QUILL_SUBJECT_PREFIX", "QUILL_DUPLICATE_WINDOW", "QUILL_IDEMPOTENCY_RETENTION", "QUILL_KEY_RETENTION",
	"QUILL_IDEMPOTENCY_WAIT", "QUILL_MAX_BODY_BYTES", "QUILL_MAX_ATTACHMENT_BYTES", "QUILL_OUTBOX_RETENTION",
	"QUILL_INBOX_RETENTION", "QUILL_CONSUMER", "QUILL_MAX_DELIVER", "QUILL_ACK_WAIT", "QUILL_WORKER_CONCURRENCY",
	"QUILL_MAX_PIXELS", "QUILL_WORKER_DECODE_MEMORY", "QUILL_READ_TIMEOUT", "QUILL_WRITE_TIMEOUT",
	"QUILL_IDLE_TIMEOUT", "QUILL_MAX_CONCURRENCY", "QUILL_TENANT_CONCURRENCY", "QUILL_LOG_LEVEL",
}

// perProcess are the settings whose default differs by process: the
// shared file names them only in a comment.
var perProcess = []string{"QUILL_ADMIN_ADDR", "QUILL_CONSUMER"}

// runtimeSettings are read by Go's runtime, not by a flag.
var runtimeSettings = []string{"GOMEMLIMIT"}

// helpSettings returns the variables, with their defaults, that
// "prog cmd --help" lists.
func helpSettings(t *testing.T, prog, cmd string) map[string]string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, prog), cmd, "--help").Output()
	require.NoError(t, err)
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`\(([A-Z][A-Z0-9_]*), default "([^"]*)"\)`).FindAllStringSubmatch(string(out), -1) {
		vars[m[1]] = m[2]
	}
	require.NotEmpty(t, vars, "%s %s --help lists its settings", prog, cmd)
	return vars
}

// exampleSettings reads quill.env.example: set maps the assignments in
// force, shown the ones in comments ("#NAME=default").
func exampleSettings(t *testing.T) (set, shown map[string]string) {
	t.Helper()
	b, err := os.ReadFile("quill.env.example")
	require.NoError(t, err)
	set, shown = map[string]string{}, map[string]string{}
	re := regexp.MustCompile(`^(#?)([A-Z][A-Z0-9_]*)=(.*)$`)
	for line := range strings.Lines(string(b)) {
		m := re.FindStringSubmatch(strings.TrimRight(line, "\n"))
		if m == nil {
			continue
		}
		_, dup := set[m[2]]
		_, dup2 := shown[m[2]]
		require.False(t, dup || dup2, "%s listed twice", m[2])
		if m[1] == "" {
			set[m[2]] = m[3]
		} else {
			shown[m[2]] = m[3]
		}
	}
	return set, shown
}

// TestEnvironmentExample checks quill.env.example against the programs:
// it names no setting that none of them reads, every SPEC §2 setting that
// a unit's program reads is in it, and every default it shows is the
// program's.
func TestEnvironmentExample(t *testing.T) {
	t.Parallel()
	set, shown := exampleSettings(t)
	reads := map[string][]shipped{} // variable → the units whose program reads it
	defaults := map[string]map[string]string{}
	for _, s := range units {
		vars := helpSettings(t, s.prog, s.cmd)
		defaults[s.file] = vars
		for v := range vars {
			reads[v] = append(reads[v], s)
		}
		for _, v := range specSettings {
			if _, ok := vars[v]; !ok || slices.Contains(perProcess, v) {
				continue
			}
			_, isSet := set[v]
			_, isShown := shown[v]
			require.True(t, isSet || isShown, "%s reads %s (SPEC §2): quill.env.example must name it", s.file, v)
		}
	}
	for v, def := range shown {
		if slices.Contains(runtimeSettings, v) {
			continue
		}
		require.NotEmpty(t, reads[v], "no unit's program reads %s", v)
		require.NotContains(t, perProcess, v, "%s differs by process: not in the shared file", v)
		for _, s := range reads[v] {
			want := defaults[s.file][v]
			if dw, err := time.ParseDuration(want); err == nil {
				dg, err := time.ParseDuration(def)
				require.NoError(t, err, "%s=%s", v, def)
				require.Equal(t, dw, dg, "%s: the default %s %s uses", v, s.prog, s.cmd)
				continue
			}
			require.Equal(t, want, def, "%s: the default %s %s uses", v, s.prog, s.cmd)
		}
	}
	for v := range set {
		require.NotEmpty(t, reads[v], "no unit's program reads %s", v)
	}
}

// installedUnits copies the units into a directory of their own with their
// ExecStart pointing at the programs TestMain built, and returns it.
func installedUnits(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, s := range units {
		b, err := os.ReadFile(s.file)
		require.NoError(t, err)
		b = bytes.ReplaceAll(b, []byte("ExecStart="+installedBin), []byte("ExecStart="+binDir+string(filepath.Separator)))
		require.NoError(t, os.WriteFile(filepath.Join(dir, s.file), b, 0o644))
	}
	return dir
}

// TestSystemdAnalyze runs systemd's own checks where systemd-analyze is
// installed: verify (every key and value understood, the commands
// executable, the dependencies found: no output at all) and the offline
// security review (exposure at most 2.0 of 10, systemd's "OK").
func TestSystemdAnalyze(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian's systemd package has it): the units are checked by TestUnits alone")
	}
	dir := installedUnits(t)
	args := []string{"verify"}
	for _, s := range units {
		args = append(args, filepath.Join(dir, s.file))
	}
	cmd := exec.Command(analyze, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify:\n%s", out)
	require.Empty(t, string(out), "systemd-analyze verify has nothing to say")
	for _, s := range units {
		cmd := exec.Command(analyze, "security", "--offline=yes", "--threshold=20", filepath.Join(dir, s.file))
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "systemd-analyze security %s:\n%s", s.file, out)
	}
}
