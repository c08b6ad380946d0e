// Package testenv is the consumer module's test world, without the
// server's module (whose test harness runs nats-server in-process and so
// would make nats-server a requirement of this module): a fresh PostgreSQL
// schema per test on the test database, and a nats-server process per test
// that can be stopped and started again on its port and store, as an
// outage. Test-only.
//
// The database is QUILL_TEST_DATABASE_URL, by default the local quill_test
// database (created when missing). The server is the binary
// QUILL_NATS_SERVER names, else the repository's .data/bin/nats-server
// (make test builds the version the server's go.mod pins there); without
// one the tests skip, and fail under CI=true.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDatabaseURL is the test database without QUILL_TEST_DATABASE_URL.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/quill_test?sslmode=disable"

// readyTimeout bounds a server's (re)start.
const readyTimeout = 15 * time.Second

var createOnce sync.Once

// EmptySchema creates a schema of t's own in the test database and returns
// a URL whose connections use it (search_path); it is dropped when t ends.
func EmptySchema(t testing.TB) string {
	t.Helper()
	base := os.Getenv("QUILL_TEST_DATABASE_URL")
	if base == "" {
		base = DefaultDatabaseURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createOnce.Do(func() { ensureDatabase(ctx, t, base) })
	schema := "t_" + randomHex(6)
	if err := execOn(ctx, base, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("testenv: create schema on %s (set QUILL_TEST_DATABASE_URL): %v", base, err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := execOn(cctx, base, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("testenv: drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: QUILL_TEST_DATABASE_URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// ensureDatabase creates the database base names when it does not exist;
// another package's tests creating it at the same moment is no failure.
func ensureDatabase(ctx context.Context, t testing.TB, base string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatalf("testenv: QUILL_TEST_DATABASE_URL: %v", err)
	}
	conn, err := pgx.Connect(ctx, base)
	if err == nil {
		conn.Close(ctx)
		return
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		t.Fatalf("testenv: connect to the test database %s (set QUILL_TEST_DATABASE_URL): %v", base, err)
	}
	admin, _ := url.Parse(base)
	admin.Path = "/postgres"
	err = execOn(ctx, admin.String(), "CREATE DATABASE "+pgx.Identifier{cfg.Database}.Sanitize())
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		err = nil
	}
	if err != nil {
		t.Fatalf("testenv: create the test database: %v", err)
	}
}

func execOn(ctx context.Context, dbURL, sql string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NATS is a nats-server process with JetStream on a port and store
// directory of its own.
type NATS struct {
	bin, store, logFile string
	port                int

	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartNATS starts a server for t, stopped when t ends.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	bin := os.Getenv("QUILL_NATS_SERVER")
	if bin == "" {
		bin = repoServer()
	}
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("testenv: no nats-server: set QUILL_NATS_SERVER (make test builds the pinned one into .data/bin)")
		}
		t.Skip("testenv: QUILL_NATS_SERVER unset and no .data/bin/nats-server in the repository (make test builds it)")
	}
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	n := &NATS{bin: bin, store: filepath.Join(dir, "store"), logFile: filepath.Join(dir, "nats-server.log"), port: port}
	t.Cleanup(n.Stop)
	n.Restart(t)
	return n
}

// repoServer is the repository's .data/bin/nats-server — the version the
// server's go.mod pins, which make test and make dev build — found from the
// working directory up, or "". Not one from PATH: a distribution's may be
// years older than the JetStream behaviour the tests hold the package to.
func repoServer() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		bin := filepath.Join(dir, ".data", "bin", "nats-server")
		if st, err := os.Stat(bin); err == nil && !st.IsDir() {
			return bin
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// URL is the server's client URL.
func (n *NATS) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

// Stop stops the server (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (n *NATS) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = n.cmd.Process.Kill()
		<-done
	}
	n.cmd = nil
}

// Restart stops the server if it runs and starts it again on the same port
// and store, returning once it answers with JetStream enabled.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	n.Stop()
	n.mu.Lock()
	defer n.mu.Unlock()
	logf, err := os.OpenFile(n.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(n.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-js", "-sd", n.store)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", n.bin, err)
	}
	n.cmd = cmd
	deadline := time.Now().Add(readyTimeout)
	for {
		err := n.probe()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(n.logFile)
			t.Fatalf("testenv: nats-server on :%d not ready within %s: %v\n%s", n.port, readyTimeout, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *NATS) probe() error {
	nc, err := nats.Connect(n.URL(), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	return nil
}

// Connect connects to the server, reconnecting forever every 20 ms, and
// returns the connection with a JetStream handle; closed when t ends.
func (n *NATS) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{nats.Name(t.Name()), nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(0, 0)}, opts...)
	nc, err := nats.Connect(n.URL(), all...)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", n.URL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
