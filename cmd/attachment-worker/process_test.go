package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
)

// process is the worker program running in a process of its own: the test
// binary re-executed with helperEnv (see TestMain).
type process struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	// exited receives the process's exit status once it exited.
	exited chan int
}

// startProcess runs the worker program with exactly the environment vars
// (and PATH), until the test ends: then it is sent SIGTERM, and killed if it
// has not exited 30 s later.
func startProcess(t *testing.T, vars map[string]string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(os.Args[0]), stderr: &syncBuffer{}, exited: make(chan int, 1)}
	p.cmd.Env = []string{helperEnv + "=1", "PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = io.Discard, p.stderr
	require.NoError(t, p.cmd.Start())
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
			p.exited <- 0
		case errors.As(err, &ee):
			p.exited <- ee.ExitCode()
		default:
			p.exited <- -1
		}
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-waited
		}
		if t.Failed() {
			t.Logf("the worker process's log:\n%s", p.stderr.String())
		}
	})
	return p
}

// stop sends SIGTERM and requires a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case code := <-p.exited:
		require.Equal(t, 0, code, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not exit after SIGTERM")
	}
}

// fixture is a database and a stream with the notes service writing to
// one tenant, events published as a relay would.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	js     jetstream.JetStream
	notes  *noteWriter
	tenant string
	prefix string
	vars   map[string]string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, dbURL := dbtest.Pool(t, 4)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	provisionAsRelay(t, srv, "P_"+suffix, "q"+suffix)
	return &fixture{t: t, pool: pool, js: js, notes: newNoteWriter(t, pool, "t-"+suffix), tenant: "t-" + suffix, prefix: "q" + suffix,
		vars: map[string]string{"DATABASE_URL": dbURL, "NATS_URL": srv.URL(), "QUILL_STREAM": "P_" + suffix,
			"QUILL_SUBJECT_PREFIX": "q" + suffix, "QUILL_CONSUMER": "w-" + suffix, "QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}}
}

// publish creates a note with an attachment of data, publishes its
// note.created event and returns the note's and the event's ids.
func (f *fixture) publish(data []byte) (note uuid.UUID, event string) {
	t := f.t
	t.Helper()
	payload := f.notes.create("k-"+uuid.NewString(), "a", "application/octet-stream", data)
	var e struct {
		ID      string `json:"id"`
		Subject string `json:"subject"`
	}
	require.NoError(t, json.Unmarshal(payload, &e))
	publishEvent(t, f.js, f.prefix+"."+f.tenant+".note.created", payload)
	return uuid.MustParse(e.Subject), e.ID
}

func (f *fixture) status(note uuid.UUID) string {
	var s string
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `SELECT status FROM attachments WHERE note_id = $1`, note).Scan(&s))
	return s
}

func (f *fixture) waitStatus(note uuid.UUID, status string) {
	f.t.Helper()
	testkit.WaitFor(f.t, 60*time.Second, func() bool { return f.status(note) == status }, fmt.Sprintf("note %s %s", note, status))
}

// An event whose processing kills the process (here: exits at once, as an
// out-of-memory kill would) is delivered QUILL_MAX_DELIVER times, each
// time to a process that dies, and on the next delivery it becomes a dead
// letter before it is processed again; the events before and after it are
// processed.
func TestProcessKillingEventEndsAsDeadLetter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	vars := f.vars
	vars["QUILL_MAX_DELIVER"], vars["QUILL_ACK_WAIT"], vars["QUILL_WORKER_CONCURRENCY"] = "3", "1s", "1"
	before, _ := f.publish([]byte("before\n"))
	killer, killerEvent := f.publish([]byte("killer\n"))
	vars[crashEnv] = killerEvent

	for i := range 3 {
		p := startProcess(t, vars)
		select {
		case code := <-p.exited:
			require.Equal(t, crashStatus, code, "process %d: %s", i+1, p.stderr.String())
		case <-time.After(60 * time.Second):
			t.Fatalf("process %d did not die on the killer event", i+1)
		}
	}
	f.waitStatus(before, "processed")

	p := startProcess(t, vars)
	testkit.WaitFor(t, 60*time.Second, func() bool {
		var n int
		require.NoError(t, f.pool.QueryRow(t.Context(), `SELECT count(*) FROM quill_consumer_dead_letters`).Scan(&n))
		return n == 1
	}, "the killer event dead-lettered")
	store, err := consumer.NewStore(f.pool, "")
	require.NoError(t, err)
	letters, err := store.DeadLetters(t.Context(), consumer.DeadLetterQuery{Consumer: vars["QUILL_CONSUMER"]})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, killerEvent, letters[0].EventID)
	require.Equal(t, "delivered 4 times, the limit is 3 (not processed again)", letters[0].Reason)
	require.Equal(t, 4, letters[0].Deliveries)
	require.Equal(t, "pending", f.status(killer))

	after, _ := f.publish([]byte("after\n"))
	f.waitStatus(after, "processed")
	select {
	case code := <-p.exited:
		t.Fatalf("the fourth process exited (%d)", code)
	default:
	}
	p.stop(t)
}
