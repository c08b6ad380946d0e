package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

// syncBuffer is the shared in-process helper, under this package's name.
type syncBuffer = clitest.SyncBuffer

// The real program, in-process: it provisions the stream and consumer,
// processes an attachment, serves the admin endpoints, dead-letters an
// unparseable event that the CLI lists and re-drives, and exits 0 when its
// context ends.
func TestRunProcessesAndDeadLetters(t *testing.T) {
	t.Parallel()
	pool, dbURL := dbtest.Pool(t, 4)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	admin := clitest.FreeAddr(t)
	vars := map[string]string{"DATABASE_URL": dbURL, "NATS_URL": srv.URL(), "QUILL_STREAM": "CMD_" + suffix,
		"QUILL_SUBJECT_PREFIX": "q" + suffix, "QUILL_CONSUMER": "w-" + suffix, "QUILL_ADMIN_ADDR": admin,
		"QUILL_MAX_DELIVER": "2", "QUILL_ACK_WAIT": "5s", "QUILL_LOG_LEVEL": "debug"}
	stderr, _, stop := startWorker(t, vars)
	// No relay has created the stream yet: the worker waits and says why.
	body := waitReadyz(t, admin, http.StatusServiceUnavailable)
	require.Contains(t, body, "stream CMD_"+suffix+" not found; waiting for a relay to create it")
	provisionAsRelay(t, srv, "CMD_"+suffix, "q"+suffix)
	waitReadyz(t, admin, http.StatusOK)

	// A note.created event as the relay publishes it.
	tenant := "t-" + suffix
	payload := newNoteWriter(t, pool, tenant).create("k1", "a.txt", "text/plain", []byte("hello\nworld\n"))
	subject := "q" + suffix + "." + tenant + ".note.created"
	publishEvent(t, js, subject, payload)
	testkit.WaitFor(t, 30*time.Second, func() bool {
		var status string
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT status FROM attachments`).Scan(&status))
		return status == "processed"
	}, "processed")

	// An unparseable event becomes a dead letter at once.
	bad := nats.NewMsg(subject)
	bad.Data = []byte("not an event")
	bad.Header.Set(nats.MsgIdHdr, "bad-1")
	_, err := js.PublishMsg(t.Context(), bad)
	require.NoError(t, err)
	testkit.WaitFor(t, 30*time.Second, func() bool {
		_, b, ok := getAdmin(admin, "/metrics")
		return ok && strings.Contains(b, `quill_worker_messages_total{result="dead_lettered"} 1`) &&
			strings.Contains(b, `quill_worker_messages_total{result="processed"} 1`) &&
			// The consumer package's, which show a worker that stopped
			// consuming: both messages acknowledged, the backlog exported.
			strings.Contains(b, `quill_consumer_acks_total{consumer="w-`+suffix+`"} 2`) &&
			strings.Contains(b, `quill_consumer_pending_messages{consumer="w-`+suffix+`",stream="CMD_`+suffix+`"} `)
	}, "metrics show one processed and one dead letter, acknowledged")
	// Counted in the table by the consumer's poll; the worker's gauge
	// reads the consumer's.
	testkit.WaitFor(t, 30*time.Second, func() bool {
		_, b, ok := getAdmin(admin, "/metrics")
		return ok && strings.Contains(b, "\nquill_worker_dead_letters 1\n") &&
			strings.Contains(b, `quill_consumer_dead_letters{consumer="w-`+suffix+`"} 1`)
	}, "the dead letter counted")

	var out bytes.Buffer
	cli := map[string]string{"DATABASE_URL": dbURL, "NATS_URL": srv.URL(), "QUILL_CONSUMER": "w-" + suffix}
	require.NoError(t, run(t.Context(), []string{"dead-letters", "list"}, clitest.Env(cli), &out, io.Discard))
	require.Contains(t, out.String(), "event bad-1")
	require.Contains(t, out.String(), "unparseable event")
	out.Reset()
	require.NoError(t, run(t.Context(), []string{"dead-letters", "list", "--json"}, clitest.Env(cli), &out, io.Discard))
	require.Contains(t, out.String(), `"event_id":"bad-1"`)
	var id int64
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT id FROM quill_consumer_dead_letters`).Scan(&id))
	out.Reset()
	require.NoError(t, run(t.Context(), []string{"dead-letters", "retry", fmt.Sprint(id)}, clitest.Env(cli), &out, io.Discard))
	require.Contains(t, out.String(), "republished to "+subject)
	// Still unparseable: it comes back as a second dead letter.
	testkit.WaitFor(t, 30*time.Second, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM quill_consumer_dead_letters`).Scan(&n))
		return n == 2
	}, "the re-driven message dead-lettered again")
	out.Reset()
	require.NoError(t, run(t.Context(), []string{"dead-letters", "list"}, clitest.Env(cli), &out, io.Discard))
	require.Equal(t, 1, strings.Count(out.String(), "\n"), out.String())

	stop()
	require.Contains(t, stderr.String(), `"message":"stopped"`)
}

// waitReadyz waits until the worker's /readyz answers status and returns
// the body.
func waitReadyz(t *testing.T, admin string, status int) string {
	t.Helper()
	var body string
	testkit.WaitFor(t, 30*time.Second, func() bool {
		st, b, ok := getAdmin(admin, "/readyz")
		if !ok {
			return false
		}
		body = b
		return st == status
	}, fmt.Sprintf("/readyz %d", status))
	return body
}

// getAdmin answers GET path of the worker's admin server: its status and
// body, or ok false while the server does not answer.
func getAdmin(admin, path string) (status int, body string, ok bool) {
	resp, err := http.Get("http://" + admin + path)
	if err != nil {
		return 0, "", false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), true
}

// noteWriter writes one tenant's notes through the notes service, as the
// API does.
type noteWriter struct {
	t      *testing.T
	pool   *pgxpool.Pool
	svc    *notes.Service
	tenant string
}

func newNoteWriter(t *testing.T, pool *pgxpool.Pool, tenant string) *noteWriter {
	t.Helper()
	svc, err := notes.NewService(pool, notes.Config{}, zerolog.Nop())
	require.NoError(t, err)
	return &noteWriter{t: t, pool: pool, svc: svc, tenant: tenant}
}

// create writes a note with an attachment of data under key and returns
// the payload of its note.created event, as the relay would publish it.
func (w *noteWriter) create(key, filename, contentType string, data []byte) []byte {
	t := w.t
	t.Helper()
	sum := sha256.Sum256(data)
	_, err := w.svc.Create(t.Context(), notes.Request{Tenant: w.tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite},
		notes.CreateParams{Title: "x", Attachment: &notes.NewAttachment{Filename: filename, ContentType: contentType,
			Data: data, SHA256: hex.EncodeToString(sum[:])}})
	require.NoError(t, err)
	var payload []byte
	require.NoError(t, w.pool.QueryRow(t.Context(), `SELECT payload FROM outbox_events WHERE type = 'note.created' ORDER BY seq DESC LIMIT 1`).Scan(&payload))
	return payload
}

// publishEvent publishes an event's payload on subject, as the relay does.
func publishEvent(t *testing.T, js jetstream.JetStream, subject string, payload []byte) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = payload
	_, err := js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
}

// provisionAsRelay creates the stream as a relay starting does.
func provisionAsRelay(t *testing.T, srv *natstest.Server, name, prefix string) {
	t.Helper()
	_, js := srv.Connect(t)
	_, err := stream.Provision(t.Context(), js, stream.Config{Name: name, SubjectPrefix: prefix}.WithDefaults())
	require.NoError(t, err)
}

// NATS stopped right after the worker started: the worker keeps running
// (it used to exit with "start consuming: …"), says why it is not ready,
// and consumes once NATS is back.
func TestRunSurvivesNATSGoneAtStart(t *testing.T) {
	t.Parallel()
	pool, dbURL := dbtest.Pool(t, 4)
	srv := natstest.Start(t)
	suffix := testkit.UniqueSuffix()
	provisionAsRelay(t, srv, "GONE_"+suffix, "q"+suffix)
	admin := clitest.FreeAddr(t)
	vars := map[string]string{"DATABASE_URL": dbURL, "NATS_URL": srv.URL(), "QUILL_STREAM": "GONE_" + suffix,
		"QUILL_SUBJECT_PREFIX": "q" + suffix, "QUILL_CONSUMER": "w-" + suffix, "QUILL_ADMIN_ADDR": admin, "QUILL_ACK_WAIT": "5s"}
	stderr, exited, stop := startWorker(t, vars)
	testkit.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(stderr.String(), `"listener":"admin"`) }, "the worker to start")
	srv.Stop()
	body := waitReadyz(t, admin, http.StatusServiceUnavailable)
	require.Contains(t, strings.ToLower(body), "nats")
	select {
	case err := <-exited:
		t.Fatalf("the worker exited while NATS was down: %v\n%s", err, stderr.String())
	default:
	}
	srv.Restart(t)
	waitReadyz(t, admin, http.StatusOK)

	tenant := "t-" + suffix
	payload := newNoteWriter(t, pool, tenant).create("k1", "a.txt", "text/plain", []byte("back\n"))
	_, js := srv.Connect(t)
	publishEvent(t, js, "q"+suffix+"."+tenant+".note.created", payload)
	testkit.WaitFor(t, 30*time.Second, func() bool {
		var status string
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT status FROM attachments`).Scan(&status))
		return status == "processed"
	}, "processed after NATS came back")

	stop()
}

// TestClusterFailover: a worker given the cluster's server list keeps its
// durable consumer as each node in turn is stopped and started again, and
// processes the notes written meanwhile.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	pool, dbURL := dbtest.Pool(t, 4)
	cl := natstest.StartCluster(t, 3)
	_, js := cl.Connect(t)
	suffix := testkit.UniqueSuffix()
	name, prefix := "CL_"+suffix, "q"+suffix
	_, err := stream.Provision(t.Context(), js, stream.Config{Name: name, SubjectPrefix: prefix, Replicas: 3}.WithDefaults())
	require.NoError(t, err)
	cl.WaitForStreamReplicas(t, js, name, 3)
	admin := clitest.FreeAddr(t)
	vars := map[string]string{"DATABASE_URL": dbURL, "NATS_URL": cl.URLs(), "QUILL_STREAM": name,
		"QUILL_SUBJECT_PREFIX": prefix, "QUILL_CONSUMER": "w-" + suffix, "QUILL_ADMIN_ADDR": admin, "QUILL_ACK_WAIT": "5s"}
	_, _, stop := startWorker(t, vars)
	waitReadyz(t, admin, http.StatusOK)
	// The consumer the worker just created is current on every node
	// before the first node stops.
	cl.WaitHealthy(t)

	tenant := "t-" + suffix
	writer := newNoteWriter(t, pool, tenant)
	for i := range 3 {
		cl.Stop(i)
		payload := writer.create(fmt.Sprintf("k%d", i), "a.txt", "text/plain", fmt.Appendf(nil, "note %d\n", i))
		m := nats.NewMsg(prefix + "." + tenant + ".note.created")
		m.Data = payload
		testkit.WaitFor(t, 30*time.Second, func() bool {
			pctx, pcancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer pcancel()
			_, err := js.PublishMsg(pctx, m)
			return err == nil
		}, "the note's event published")
		testkit.WaitFor(t, 30*time.Second, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM attachments WHERE status = 'processed'`).Scan(&n))
			return n == i+1
		}, fmt.Sprintf("note %d processed with node %d down", i, i))
		cl.Restart(t, i)
		// Caught up, stream and consumer, before the next node stops (and
		// before the end: a node shut down while catching up may leave a
		// store goroutine), as a rolling restart waits for /healthz.
		cl.WaitForStreamReplicas(t, js, name, 3)
		cl.WaitHealthy(t)
	}
	stop()
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		vars map[string]string
		code int
	}{
		{"bad max deliver", nil, map[string]string{"QUILL_MAX_DELIVER": "zero"}, 2},
		{"bad ack wait", nil, map[string]string{"QUILL_ACK_WAIT": "soon"}, 2},
		{"bad concurrency", nil, map[string]string{"QUILL_WORKER_CONCURRENCY": "0"}, 2},
		{"zero ack wait", nil, map[string]string{"QUILL_ACK_WAIT": "0s"}, 2},
		{"concurrency above MaxAckPending", nil, map[string]string{"QUILL_WORKER_CONCURRENCY": fmt.Sprint(consumer.DefaultMaxAckPending + 1)}, 2},
		{"zero decode memory", nil, map[string]string{"QUILL_WORKER_DECODE_MEMORY": "0"}, 2},
		{"bad decode memory", nil, map[string]string{"QUILL_WORKER_DECODE_MEMORY": "256MiB"}, 2},
		{"zero max pixels", nil, map[string]string{"QUILL_MAX_PIXELS": "0"}, 2},
		{"bad max pixels", nil, map[string]string{"QUILL_MAX_PIXELS": "many"}, 2},
		{"bad log level", nil, map[string]string{"QUILL_LOG_LEVEL": "loud"}, 2},
		{"malformed server list", nil, map[string]string{"NATS_URL": "nats://127.0.0.1:1,,nats://127.0.0.1:2"}, 2},
		{"unreadable credentials", nil, map[string]string{"QUILL_NATS_CREDS": "/nonexistent/user.creds"}, 2},
		{"certificate without key", nil, map[string]string{"QUILL_NATS_TLS_CERT": "run.go"}, 2},
		{"retry with a malformed server list", []string{"dead-letters", "retry", "1"}, map[string]string{"NATS_URL": "nats://:1"}, 2},
		{"retry with unreadable credentials", []string{"dead-letters", "retry", "1"}, map[string]string{"QUILL_NATS_CREDS": "/nonexistent"}, 2},
		{"unknown command", []string{"frobnicate"}, nil, 2},
		{"retry without id", []string{"dead-letters", "retry"}, nil, 2},
		{"retry bad id", []string{"dead-letters", "retry", "abc"}, nil, 2},
		{"database unreachable", nil, map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?sslmode=disable"}, 1},
		{"help", []string{"--help"}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			err := run(t.Context(), tc.args, clitest.Env(tc.vars), io.Discard, &stderr)
			require.Equal(t, tc.code, exitCode(err, &stderr), "%v", err)
			if tc.code == 1 {
				require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one JSON log line: %s", stderr.String())
				require.Contains(t, stderr.String(), `"error_category":"database_unreachable"`)
			}
		})
	}
}

// startWorker runs the worker's daemon with vars in the background: its
// log, a channel that receives run's error should it return on its own, and
// stop, which ends it as SIGTERM would and requires it to return nil within
// 30 s.
func startWorker(t *testing.T, vars map[string]string) (stderr *syncBuffer, exited <-chan error, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stderr = &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the worker's log:\n%s", stderr.String())
		}
	})
	errc := make(chan error, 1)
	// The consumer's gauges read often, so that a dead letter shows at
	// once.
	fast := func(c *worker.Config) { c.Consumer.PendingInterval = 50 * time.Millisecond }
	go func() { errc <- runWith(ctx, nil, clitest.Env(vars), io.Discard, stderr, fast) }()
	return stderr, errc, func() {
		t.Helper()
		cancel()
		select {
		case err := <-errc:
			require.NoError(t, err, stderr.String())
		case <-time.After(30 * time.Second):
			t.Fatal("run did not return after SIGTERM")
		}
	}
}
