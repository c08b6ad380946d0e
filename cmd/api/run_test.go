package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/migrations"
)

// createToken runs "api token create --tenant acme" and returns the token
// it printed.
func createToken(t *testing.T, getenv func(string) string) string {
	t.Helper()
	tok, _, err := clitest.RunOut(t, run, getenv, "token", "create", "--tenant", "acme")
	require.NoError(t, err)
	return strings.TrimSpace(tok)
}

// startServe starts "api serve" with vars and waits until its /readyz answers.
func startServe(t *testing.T, vars map[string]string) *clitest.Process {
	t.Helper()
	p := clitest.Start(t, run, clitest.Env(vars), "serve")
	waitReady(t, "http://"+vars["QUILL_ADMIN_ADDR"]+"/readyz")
	return p
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, func() bool {
		res, err := http.Get(url)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, "ready: "+url)
}

func post(t *testing.T, base, token, key, body string) (*http.Response, string) {
	t.Helper()
	res, b := apitest.PostNote(context.Background(), t, base, token, key, []byte(body))
	return res, string(b)
}

func TestReplayAfterProcessRestart(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}
	getenv := clitest.Env(vars)
	tok := createToken(t, getenv)
	require.Regexp(t, `^qt_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$`, tok, "token create prints only the token")

	base := "http://" + vars["QUILL_HTTP_ADDR"]
	p := startServe(t, vars)
	res, first := post(t, base, tok, "restart-1", `{"title":"survives"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode, first)
	require.NoError(t, p.Stop(), "graceful shutdown returns nil")
	require.Contains(t, p.Stderr.String(), `"message":"stopped"`)

	p = clitest.Start(t, run, getenv) // serve is the default command
	waitReady(t, "http://"+vars["QUILL_ADMIN_ADDR"]+"/readyz")
	res, again := post(t, base, tok, "restart-1", `{"title":"survives"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	require.Equal(t, "true", res.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first, again)

	// The admin address serves metrics with the API's counters.
	mres, err := http.Get("http://" + vars["QUILL_ADMIN_ADDR"] + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(mres.Body)
	mres.Body.Close()
	require.Contains(t, string(metrics), `quill_idempotency_requests_total{action="create-note",outcome="replayed"} 1`)
	require.Contains(t, string(metrics), `quill_business_effects_total{action="create-note"} 0`, "this process executed nothing")
	hres, err := http.Get("http://" + vars["QUILL_ADMIN_ADDR"] + "/healthz")
	require.NoError(t, err)
	hres.Body.Close()
	require.Equal(t, http.StatusOK, hres.StatusCode)
	require.NoError(t, p.Stop())

	// Logs carry the key's hash, never the key, title or token.
	logs := p.Stderr.String()
	require.Contains(t, logs, `"key_hash"`)
	require.NotContains(t, logs, "restart-1")
	require.NotContains(t, logs, "survives")
	require.NotContains(t, logs, tok[12:])
}

func TestTokenRevoke(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}
	getenv := clitest.Env(vars)
	tok := createToken(t, getenv)
	startServe(t, vars)
	base := "http://" + vars["QUILL_HTTP_ADDR"]
	res, _ := post(t, base, tok, "k1", `{"title":"a"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	_, _, err := clitest.RunOut(t, run, getenv, "token", "revoke", tok[:11])
	require.NoError(t, err)
	// Refused within the token cache's TTL (the cache is tested in
	// internal/auth).
	attempt := 0
	testkit.WaitFor(t, tokenCacheTTL+5*time.Second, func() bool {
		attempt++
		res, _ := post(t, base, tok, fmt.Sprintf("k2-%d", attempt), `{"title":"a"}`)
		return res.StatusCode == http.StatusUnauthorized
	}, "the revoked token refused")
	_, _, err = clitest.RunOut(t, run, getenv, "token", "revoke", "qt_ffffffff")
	require.ErrorContains(t, err, "no token with this prefix")
}

// TestOperatorTokenAndConsole: "api token create --operator" makes a token
// the console takes; QUILL_CONSOLE=true serves the console on the admin
// address (and not on the API's); by default there is none (404); "api
// token revoke" revokes an operator token too.
func TestOperatorTokenAndConsole(t *testing.T) {
	t.Parallel()
	schema := dbtest.Schema(t)
	vars := map[string]string{"DATABASE_URL": schema, "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"QUILL_CONSOLE": "true", "NATS_URL": "nats://127.0.0.1:1"} // no NATS: the console serves without it
	getenv := clitest.Env(vars)
	tok, _, err := clitest.RunOut(t, run, getenv, "token", "create", "--operator", "--name", "alice")
	require.NoError(t, err)
	tok = strings.TrimSpace(tok)
	require.Regexp(t, `^qo_[0-9a-f]{8}_[A-Za-z0-9_-]{43}$`, tok)
	clitest.Start(t, run, getenv, "serve")
	admin := "http://" + vars["QUILL_ADMIN_ADDR"]
	waitReady(t, admin+"/readyz")
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noRedirect.Get(admin + "/console/")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/console/signin?next=%2Fconsole%2F", res.Header.Get("Location"))
	res, err = http.Get(admin + "/console/signin")
	require.NoError(t, err)
	page, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, string(page), `action="/console/signin"`, "the sign-in page")
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "script-src 'self'")
	res, err = http.Get("http://" + vars["QUILL_HTTP_ADDR"] + "/console/")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusNotFound, res.StatusCode, "the console is on the admin address only")
	_, _, err = clitest.RunOut(t, run, getenv, "token", "revoke", tok[:11])
	require.NoError(t, err)

	// The default: no console, no sign-in page.
	off := map[string]string{"DATABASE_URL": schema, "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}
	clitest.Start(t, run, clitest.Env(off), "serve")
	waitReady(t, "http://"+off["QUILL_ADMIN_ADDR"]+"/readyz")
	for _, p := range []string{"/console/", "/console/signin", "/console"} {
		res, err = noRedirect.Get("http://" + off["QUILL_ADMIN_ADDR"] + p)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusNotFound, res.StatusCode, p)
	}
}

// TestConsoleRotateKey: "api console rotate-key" adds a session key and
// says which; --end-sessions drops every older one.
func TestConsoleRotateKey(t *testing.T) {
	t.Parallel()
	schema := dbtest.Schema(t)
	getenv := clitest.Env(map[string]string{"DATABASE_URL": schema})
	out, _, err := clitest.RunOut(t, run, getenv, "console", "rotate-key")
	require.NoError(t, err)
	require.Regexp(t, `^console session key 2 signs new sessions from now on; 0 older key\(s\) dropped\n$`, out)
	out, _, err = clitest.RunOut(t, run, getenv, "console", "rotate-key", "--end-sessions")
	require.NoError(t, err)
	require.Contains(t, out, "console session key 3 signs new sessions from now on; 2 older key(s) dropped")
	conn, err := pgx.Connect(t.Context(), schema)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(t.Context(), `SELECT id FROM console_session_keys`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{3}, ids)
}

func TestCommandLineErrors(t *testing.T) {
	t.Parallel()
	getenv := clitest.Env(map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"})
	cases := []struct {
		args []string
		env  map[string]string
		want string
		code int
		// logged: the error is one JSON log line on the process's stderr
		// containing this, and nothing more is printed.
		logged string
	}{
		{args: []string{"bogus"}, want: `unknown command "bogus"`, code: 2},
		{args: []string{"token"}, want: "usage: api token", code: 2},
		{args: []string{"token", "create"}, want: "--tenant is required", code: 2},
		{args: []string{"token", "create", "--tenant", "Bad_Name"}, want: "tenant names are", code: 2},
		{args: []string{"token", "revoke", "nope"}, want: "neither a token nor a token prefix", code: 2},
		{args: []string{"token", "create", "--operator"}, want: "--operator needs --name", code: 2},
		{args: []string{"token", "create", "--operator", "--name", "a", "--tenant", "acme"}, want: "exclude each other", code: 2},
		{args: []string{"token", "create", "--operator", "--name", "bad name"}, want: "operator names are", code: 2},
		{args: []string{"token", "create", "--tenant", "acme", "--name", "alice"}, want: "--name is for --operator", code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_CONSOLE": "maybe"}, want: `invalid QUILL_CONSOLE "maybe"`, code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_TRUSTED_PROXIES": "10.0.0.0/8,proxy"}, want: `invalid QUILL_TRUSTED_PROXIES "10.0.0.0/8,proxy": "proxy" is neither an IP address nor a CIDR prefix`, code: 2},
		{args: []string{"console"}, want: "usage: api console rotate-key", code: 2},
		{args: []string{"console", "bogus"}, want: `unknown console command "bogus"`, code: 2},
		{args: []string{"console", "rotate-key", "extra"}, want: "unexpected arguments", code: 2},
		{args: []string{"serve"}, env: map[string]string{"NATS_URL": "http://x"}, want: "NATS_URL", code: 2},
		{args: []string{"serve", "--idempotency-wait", "soon"}, want: `invalid --idempotency-wait "soon"`, code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_IDEMPOTENCY_RETENTION": "3"}, want: `invalid QUILL_IDEMPOTENCY_RETENTION "3"`, code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_KEY_RETENTION": "1h"}, want: "QUILL_KEY_RETENTION (1h0m0s) must be at least QUILL_IDEMPOTENCY_RETENTION", code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_LOG_LEVEL": "loud"}, want: "QUILL_LOG_LEVEL", code: 2},
		{args: []string{"serve", "--max-body-bytes", "0"}, want: "--max-body-bytes", code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_READ_TIMEOUT": "soon"}, want: `invalid QUILL_READ_TIMEOUT "soon"`, code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_MAX_CONCURRENCY": "0"}, want: `invalid QUILL_MAX_CONCURRENCY "0"`, code: 2},
		{args: []string{"serve"}, env: map[string]string{"QUILL_TENANT_CONCURRENCY": "many"}, want: "QUILL_TENANT_CONCURRENCY", code: 2},
		{args: []string{"serve", "--lock-timeout", "1s"}, want: "flag provided but not defined: -lock-timeout", code: 2}, // removed (decision 0076)
		{args: []string{"serve"}, code: 1, logged: "127.0.0.1:1"},                                                        // PostgreSQL unreachable: one clear log line
		{args: []string{"--help"}, code: 0},
		{args: []string{"serve", "--help"}, code: 0},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			g := getenv
			if tc.env != nil {
				g = func(k string) string {
					if v, ok := tc.env[k]; ok {
						return v
					}
					return getenv(k)
				}
			}
			_, logs, err := clitest.RunOut(t, run, g, tc.args...)
			var stderr bytes.Buffer
			require.Equal(t, tc.code, exitCode(err, &stderr), "err: %v", err)
			if tc.logged != "" {
				require.Empty(t, stderr.String())
				lines := strings.Split(strings.TrimSpace(logs), "\n")
				require.Len(t, lines, 1, "one line: %q", logs)
				require.Contains(t, lines[0], tc.logged)
				require.Contains(t, lines[0], `"level":"error"`)
			}
			if tc.want != "" {
				require.Contains(t, stderr.String(), tc.want)
				require.NotContains(t, strings.TrimSpace(stderr.String()), "\n", "one line")
			}
		})
	}
}

func TestMigrateCreatesDatabaseAndIsSafeConcurrently(t *testing.T) {
	t.Parallel()
	url := dbtest.MissingDatabase(t)
	getenv := clitest.Env(map[string]string{"DATABASE_URL": url})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, _, errs[i] = clitest.RunOut(t, run, getenv, "migrate") })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	_, stderr, err := clitest.RunOut(t, run, getenv, "migrate")
	require.NoError(t, err)
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	latest, err := strconv.Atoi(strings.SplitN(files[len(files)-1], "_", 2)[0]) // the numbers may have gaps
	require.NoError(t, err)
	require.Contains(t, stderr, fmt.Sprintf(`"version":%d`, latest), "every embedded migration applied")
	require.Contains(t, stderr, `"applied":[]`, "a second run applies nothing")
	require.Contains(t, stderr, `"created_database":false`)
}

// A committed create wakes the relays with a NOTIFY sent after the commit.
// A database of its own: notifications are per database, and other tests'
// would satisfy the wait.
func TestCommittedWriteNotifiesRelays(t *testing.T) {
	t.Parallel()
	url := dbtest.MissingDatabase(t)
	vars := map[string]string{"DATABASE_URL": url, "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}
	getenv := clitest.Env(vars)
	_, _, err := clitest.RunOut(t, run, getenv, "migrate")
	require.NoError(t, err)
	tok, _, err := clitest.RunOut(t, run, getenv, "token", "create", "--tenant", "acme")
	require.NoError(t, err)

	listener, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer listener.Close(context.Background())
	_, err = listener.Exec(t.Context(), "LISTEN quill_outbox")
	require.NoError(t, err)

	startServe(t, vars)
	res, body := post(t, "http://"+vars["QUILL_HTTP_ADDR"], strings.TrimSpace(tok), "n1", `{"title":"wake up"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode, body)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err, "a NOTIFY follows the commit")
	require.Equal(t, "quill_outbox", n.Channel)
}

// api migrate pointed at a transaction pooler refuses with one line naming
// the setting (exit 2) and writes nothing: the migrations' lock would not
// hold there. A fresh schema stays empty.
func TestMigrateRefusesATransactionPooler(t *testing.T) {
	t.Parallel()
	direct := dbtest.EmptySchema(t)
	pooled := dbtest.PgBouncer(t, direct)
	_, _, err := clitest.RunOut(t, run, clitest.Env(map[string]string{"DATABASE_URL": pooled}), "migrate")
	var stderr bytes.Buffer
	require.Equal(t, 2, exitCode(err, &stderr), "err: %v", err)
	require.Contains(t, stderr.String(), "DATABASE_URL reaches a transaction pooler")
	require.NotContains(t, strings.TrimSpace(stderr.String()), "\n", "one line")

	conn, err := pgx.Connect(t.Context(), direct)
	require.NoError(t, err)
	defer conn.Close(t.Context())
	var tables int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").Scan(&tables))
	require.Zero(t, tables, "nothing written")
}

// TestPprofOnlyWhenAsked: the admin address serves Go's profiles with
// QUILL_PPROF=true and not otherwise; the API's own address never does.
func TestPprofOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	schema := dbtest.Schema(t)
	for _, on := range []bool{false, true} {
		vars := map[string]string{"DATABASE_URL": schema, "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
			"QUILL_CONSOLE": "false", "QUILL_PPROF": fmt.Sprint(on)}
		clitest.Start(t, run, clitest.Env(vars), "serve")
		admin := "http://" + vars["QUILL_ADMIN_ADDR"]
		waitReady(t, admin+"/readyz")
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		for _, u := range []string{admin + "/debug/pprof/", admin + "/debug/pprof/cmdline"} {
			res, err := http.Get(u)
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, want, res.StatusCode, "%s with QUILL_PPROF=%v", u, on)
		}
		res, err := http.Get("http://" + vars["QUILL_HTTP_ADDR"] + "/debug/pprof/")
		require.NoError(t, err)
		res.Body.Close()
		require.NotEqual(t, http.StatusOK, res.StatusCode)
		res, err = http.Get(admin + "/metrics")
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
	}
}
