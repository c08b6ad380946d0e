package systemd_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/whsecret"
)

const waitLong = 30 * time.Second

// service is one unit's program, run as systemd would run it: its
// ExecStart, the example file's settings with the test's on top, and a
// notification socket of the test's own.
type service struct {
	name      string
	cmd       *exec.Cmd
	log       *clitest.SyncBuffer
	notified  <-chan string
	adminAddr string
	exited    chan error
}

// startService starts the unit file's ExecStart with the settings set in
// quill.env.example, then vars, and NOTIFY_SOCKET; the process is killed
// when the test ends, if it still runs.
func startService(t *testing.T, file string, vars map[string]string) *service {
	t.Helper()
	u := parseUnit(t, file)
	args := strings.Fields(u.value("Service", "ExecStart"))
	require.True(t, strings.HasPrefix(args[0], installedBin))
	prog := filepath.Join(binDir, strings.TrimPrefix(args[0], installedBin))

	socket := "@quill-units-" + uuid.NewString()
	s := &service{name: file, log: &clitest.SyncBuffer{}, notified: clitest.NotifySocket(t, socket),
		adminAddr: vars["QUILL_ADMIN_ADDR"], exited: make(chan error, 1)}

	set, _ := exampleSettings(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "NOTIFY_SOCKET=" + socket}
	for k, v := range set {
		if _, ok := vars[k]; !ok {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	s.cmd = exec.Command(prog, args[1:]...)
	mdwe := u.value("Service", "MemoryDenyWriteExecute") == "yes"
	if mdwe {
		s.cmd = exec.Command(os.Args[0], append([]string{prog}, args[1:]...)...)
		env = append(env, mdweEnv+"=1")
	}
	s.cmd.Env, s.cmd.Stdout, s.cmd.Stderr = env, io.Discard, s.log
	require.NoError(t, s.cmd.Start())
	go func() { s.exited <- s.cmd.Wait() }()
	if mdwe {
		testkit.WaitFor(t, waitLong, func() bool { return strings.HasPrefix(s.log.String(), "mdwe: ") }, "the launcher says")
		if !strings.HasPrefix(s.log.String(), "mdwe: applied") {
			t.Logf("%s runs without MemoryDenyWriteExecute's restriction: %s", file, strings.SplitN(s.log.String(), "\n", 2)[0])
		}
	}
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("%s's log:\n%s", file, s.log.String())
		}
	})
	return s
}

// notification waits for the next datagram on the service's socket.
func (s *service) notification(t *testing.T) string {
	t.Helper()
	select {
	case n := <-s.notified:
		return n
	case err := <-s.exited:
		// A process that notifies and then exits at once (STOPPING=1
		// and a quick shutdown) can have both ready here, and select
		// picks either: a datagram sent before the exit still counts.
		select {
		case n := <-s.notified:
			s.exited <- err // for awaitExit0
			return n
		case <-time.After(2 * time.Second):
		}
		t.Fatalf("%s exited (%v) before notifying", s.name, err)
	case <-time.After(waitLong):
		t.Fatalf("%s notified nothing", s.name)
	}
	return ""
}

// readyz returns the status of the service's /readyz.
func (s *service) readyz(t *testing.T) int {
	t.Helper()
	res, err := http.Get("http://" + s.adminAddr + "/readyz")
	require.NoError(t, err)
	res.Body.Close()
	return res.StatusCode
}

// awaitReady waits for READY=1, when /readyz must answer 200.
func (s *service) awaitReady(t *testing.T) {
	t.Helper()
	require.Equal(t, "READY=1", s.notification(t), s.name)
	require.Equal(t, http.StatusOK, s.readyz(t), "%s: READY=1 means /readyz says 200", s.name)
}

// hangUp sends SIGHUP: the service logs it, keeps running and stays ready.
func (s *service) hangUp(t *testing.T) {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	var exit error
	exited := false
	testkit.WaitFor(t, waitLong, func() bool {
		select {
		case exit = <-s.exited:
			exited = true
			return true
		default:
			return strings.Contains(s.log.String(), "SIGHUP ignored")
		}
	}, s.name+" logs the SIGHUP")
	require.False(t, exited, "%s exited on SIGHUP: %v", s.name, exit)
	require.Equal(t, http.StatusOK, s.readyz(t), "%s: still ready after SIGHUP", s.name)
}

// terminate sends SIGTERM and waits for STOPPING=1.
func (s *service) terminate(t *testing.T) {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, "STOPPING=1", s.notification(t), s.name)
}

// awaitExit0 waits for the process to exit, with status 0.
func (s *service) awaitExit0(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.exited:
		require.NoError(t, err, "%s exits 0", s.name)
	case <-time.After(waitLong):
		t.Fatalf("%s did not exit after SIGTERM", s.name)
	}
}

// TestDaemonsUnderTheirUnits runs the units' programs as systemd would,
// denied writable and executable memory (MemoryDenyWriteExecute=yes, where
// the kernel has PR_SET_MDWE): the migration exits 0; each daemon says READY=1 when /readyz answers 200,
// ignores SIGHUP (logging it) and, on SIGTERM, says STOPPING=1, finishes
// the work in flight and exits 0 — a request whose body is still arriving
// (the API), the events already published (the relay); the worker and the
// webhook dispatcher just ready, hung up on and stopped.
func TestDaemonsUnderTheirUnits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, dbURL := dbtest.Pool(t, 4)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")[:10]
	stream := "U_" + suffix
	shared := map[string]string{"DATABASE_URL": dbURL, "NATS_URL": srv.URL(), "QUILL_STREAM": stream,
		"QUILL_SUBJECT_PREFIX": "u" + suffix, "QUILL_CONSUMER": "w-" + suffix}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range shared {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	migrate := startService(t, "quill-migrate.service", shared)
	migrate.awaitExit0(t)

	httpAddr := clitest.FreeAddr(t)
	api := startService(t, "quill-api.service", with(map[string]string{"QUILL_HTTP_ADDR": httpAddr, "QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}))
	api.awaitReady(t)
	api.hangUp(t)

	// A backlog of events for the relay, written through the API.
	tenant := "u-" + suffix
	token, err := auth.Create(ctx, pool, tenant, time.Now())
	require.NoError(t, err)
	const backlog = 1000
	var g errgroup.Group
	g.SetLimit(16)
	for i := range backlog {
		g.Go(func() error {
			status, err := create(ctx, httpAddr, token, fmt.Sprintf("k-%d", i))
			if err == nil && status != http.StatusCreated {
				err = fmt.Errorf("create: status %d", status)
			}
			return err
		})
	}
	require.NoError(t, g.Wait())

	// A request in flight when SIGTERM comes: its handler has started (the
	// API answered its Expect: 100-continue), its body has not arrived.
	// The API stops accepting, finishes it, and exits 0.
	c, err := net.Dial("tcp", httpAddr)
	require.NoError(t, err)
	defer c.Close()
	body := `{"title":"in flight","body":"sent across SIGTERM"}`
	_, err = fmt.Fprintf(c, "POST /v1/notes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: in-flight\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n", token, len(body))
	require.NoError(t, err)
	replies := bufio.NewReader(c)
	res, err := http.ReadResponse(replies, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusContinue, res.StatusCode, "the handler reads the body")
	api.terminate(t)
	testkit.WaitFor(t, waitLong, func() bool {
		_, err := net.DialTimeout("tcp", httpAddr, time.Second)
		return err != nil
	}, "the API stops accepting connections")
	_, err = io.WriteString(c, body)
	require.NoError(t, err)
	res, err = http.ReadResponse(replies, nil)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode, "the request in flight is answered")
	api.awaitExit0(t)
	var notes int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM notes").Scan(&notes))
	require.Equal(t, backlog+1, notes)

	// The relay, stopped while it works through the backlog: every event
	// the stream got is marked published. Its batch (256) takes the API's
	// thousand events in four passes, too quick to stop amid, so the
	// outbox gets ten thousand more, written straight into it.
	const more = 10000
	var b pgx.Batch
	for range more {
		note := uuid.New()
		require.NoError(t, outbox.Queue(&b, outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: tenant, AggregateID: note,
			Type: contract.EventNoteCreated, Time: time.Now(), Data: map[string]any{"id": note.String()}}))
	}
	require.NoError(t, db.WithTx(ctx, pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, &b).Close() }))
	total := backlog + 1 + more
	rel := startService(t, "quill-relay.service", with(map[string]string{"QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}))
	rel.awaitReady(t)
	rel.hangUp(t)
	streamed := func() uint64 {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return 0
		}
		info, err := st.Info(ctx)
		if err != nil {
			return 0
		}
		return info.State.Msgs
	}
	testkit.WaitFor(t, waitLong, func() bool { return streamed() > 0 }, "the relay publishes")
	rel.terminate(t)
	rel.awaitExit0(t)
	var published int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL").Scan(&published))
	require.Equal(t, streamed(), uint64(published), "every event the stream holds is marked published: none was left in flight")
	require.Less(t, published, total, "stopped with the backlog under way")
	t.Logf("the relay stopped after publishing %d of %d events", published, total)

	// The worker: ready once its consumer can consume; SIGHUP and SIGTERM
	// as the others.
	w := startService(t, "quill-attachment-worker.service", with(map[string]string{"QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}))
	w.awaitReady(t)
	w.hangUp(t)
	w.terminate(t)
	w.awaitExit0(t)

	// The webhook dispatcher, on a durable consumer of its own, with the
	// key its unit's settings must provide: as the worker.
	d := startService(t, "quill-webhook-dispatcher.service", with(map[string]string{"QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"QUILL_CONSUMER": "d-" + suffix, whsecret.KeyEnv: base64.StdEncoding.EncodeToString(make([]byte, 32))}))
	d.awaitReady(t)
	d.hangUp(t)
	d.terminate(t)
	d.awaitExit0(t)
}

// create writes a note through the API under key and returns the status.
func create(ctx context.Context, addr, token, key string) (int, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/notes",
		strings.NewReader(`{"title":"backlog","body":"an event for the relay"}`))
	if err != nil {
		return 0, err
	}
	r.Header.Set("Authorization", "Bearer "+token)
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(r)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	return res.StatusCode, err
}
