package dbtest

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"os"
	osexec "os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/testkit"
)

// PgBouncerInstall is how to install the pgbouncer binary the PgBouncer
// tests need.
const PgBouncerInstall = "apt-get install -y pgbouncer (or, as root: bash scripts/ensure-pgbouncer.sh)"

// PgBouncer starts a PgBouncer process of t's own in transaction pooling
// mode, on a free loopback port in front of the server and database of
// dbURL, and returns dbURL rewritten to reach it; the process stops when t
// ends. PgBouncer refuses every startup parameter it does not know
// (ignore_startup_parameters is empty), so the search_path of a Schema URL
// is applied by the pooler on each server connection (connect_query)
// instead of being sent; every other query parameter of dbURL is kept, and a
// runtime parameter among them fails the connection as it would in
// production. Without the pgbouncer binary the test is skipped, or fails
// under CI=true.
func PgBouncer(t testing.TB, dbURL string) string {
	t.Helper()
	return PgBouncerWith(t, dbURL, PgBouncerConfig{})
}

// PgBouncerConfig is what PgBouncerWith changes of PgBouncer's settings.
type PgBouncerConfig struct {
	// Mode is pool_mode: "session", "transaction" or "statement".
	// Default "transaction".
	Mode string
	// PoolSize is default_pool_size, the backends per database and user.
	// Default 20.
	PoolSize int
}

// PgBouncerWith is PgBouncer with the settings of cfg.
func PgBouncerWith(t testing.TB, dbURL string, cfg PgBouncerConfig) string {
	t.Helper()
	mode := cmp.Or(cfg.Mode, "transaction")
	poolSize := cmp.Or(cfg.PoolSize, 20)
	bin := pgbouncerBin()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			require.FailNow(t, "pgbouncer is not installed", "install it: %s", PgBouncerInstall)
		}
		t.Skipf("pgbouncer is not installed; %s", PgBouncerInstall)
	}
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	dbname := strings.TrimPrefix(u.Path, "/")
	userName := u.User.Username()
	if userName == "" {
		userName = "postgres"
	}
	q := u.Query()
	server := fmt.Sprintf("host=%s port=%s dbname=%s user=%s", host, port, dbname, userName)
	if sp := q.Get("search_path"); sp != "" {
		server += fmt.Sprintf(" connect_query='SET search_path TO %s'", sp)
		q.Del("search_path")
	}

	dir := t.TempDir()
	users := filepath.Join(dir, "userlist.txt")
	require.NoError(t, os.WriteFile(users, fmt.Appendf(nil, "%q \"\"\n", userName), 0o600))
	listenPort := freePort(t)
	ini := filepath.Join(dir, "pgbouncer.ini")
	// The local test server trusts loopback connections: so does the
	// pooler (the user must still be in the auth file).
	require.NoError(t, os.WriteFile(ini, fmt.Appendf(nil, `[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters =
logfile =
pidfile =
`, dbname, server, listenPort, users, mode, poolSize), 0o600))

	args := []string{ini}
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root; it reads its files before
		// switching.
		args = append([]string{"-u", unprivilegedUser(t)}, args...)
	}
	cmd := osexec.Command(bin, args...)
	var out clitest.SyncBuffer // written by exec's copier, read by the test
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pgbouncer log (last lines):\n%s", lastLines(out.String(), 20))
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listenPort))
	testkit.WaitFor(t, 10*time.Second, func() bool {
		select {
		case <-exited:
			require.FailNow(t, "pgbouncer exited", "%s", out.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}, "pgbouncer to listen on "+addr)

	u.Host = addr
	u.RawQuery = q.Encode()
	return u.String()
}

// pgbouncerBin is the path of the pgbouncer binary, or "" when it is not
// installed.
func pgbouncerBin() string {
	if p, err := osexec.LookPath("pgbouncer"); err == nil {
		return p
	}
	// Debian installs it in /usr/sbin, which a user's PATH may lack.
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	return ""
}

// unprivilegedUser is the user a pgbouncer started as root runs as.
func unprivilegedUser(t testing.TB) string {
	for _, name := range []string{"postgres", "nobody"} {
		if _, err := user.Lookup(name); err == nil {
			return name
		}
	}
	require.FailNow(t, "running as root and there is neither a postgres nor a nobody user for pgbouncer to run as")
	return ""
}

// freePort is a loopback TCP port free a moment ago.
func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
