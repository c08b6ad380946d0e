package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/whsecret"
)

var secretKey = base64.StdEncoding.EncodeToString([]byte(strings.Repeat("s", 32)))

func runCmd(t *testing.T, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(t.Context(), args, func(k string) string { return env[k] }, &out, &errb)
	code := exitCode(err, &errb)
	return out.String(), errb.String(), code
}

func TestHelpAndBadSettings(t *testing.T) {
	t.Parallel()
	out, _, code := runCmd(t, nil, "--help")
	require.Zero(t, code)
	require.Contains(t, out, "deliveries retry")
	out, _, code = runCmd(t, nil, "run", "--help")
	require.Zero(t, code)
	for _, s := range []string{"QUILL_WEBHOOK_TIMEOUT", "QUILL_WEBHOOK_ALLOW_PRIVATE", "QUILL_WEBHOOK_ENDPOINT_CONCURRENCY", "QUILL_WEBHOOK_RETENTION"} {
		require.Contains(t, out, s)
	}
	_, errs, code := runCmd(t, map[string]string{}, "run")
	require.NotZero(t, code)
	require.Contains(t, errs, whsecret.KeyEnv)
	_, errs, code = runCmd(t, map[string]string{whsecret.KeyEnv: secretKey, "QUILL_WEBHOOK_BACKOFF_MIN": "2h"}, "run")
	require.NotZero(t, code)
	require.Contains(t, errs, "QUILL_WEBHOOK_BACKOFF_MIN")
	_, errs, code = runCmd(t, nil, "deliveries", "list", "--state", "lost")
	require.NotZero(t, code)
	require.Contains(t, errs, `--state "lost"`)
	_, errs, code = runCmd(t, nil, "deliveries", "retry", "x")
	require.NotZero(t, code)
	require.Contains(t, errs, `"x" is not a delivery id`)
	_, errs, code = runCmd(t, nil, "deliveries", "retry")
	require.NotZero(t, code)
	require.Contains(t, errs, "usage:")
	_, errs, code = runCmd(t, nil, "endpoints", "enable", "nope")
	require.NotZero(t, code)
	require.Contains(t, errs, `"nope" is not an endpoint id`)
}

// process is the dispatcher program in a process of its own.
type process struct {
	cmd    *exec.Cmd
	stderr *clitest.SyncBuffer
	done   chan struct{}
}

func startProcess(t *testing.T, env map[string]string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(os.Args[0]), stderr: &clitest.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = []string{helperEnv + "=1", "PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = io.Discard, p.stderr
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("dispatcher log:\n%s", p.stderr.String())
		}
	})
	return p
}

// A dispatcher killed between its POST and the mark leaves the lease to
// run out; the next dispatcher sends the same webhook-id again, and the
// delivery ends delivered once.
func TestCrashBetweenPostAndMarkResends(t *testing.T) {
	t.Parallel()
	pool, dbURL := dbtest.Pool(t, 4)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	streamName, prefix, tenant := "WD_"+strings.ToUpper(suffix), "q"+suffix, "acme-"+suffix
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: streamName, Subjects: []string{contract.AllSubjects(prefix)}})
	require.NoError(t, err)

	var mu sync.Mutex
	var got []string
	var first *process
	killed := make(chan struct{})
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, r.Header.Get("webhook-id"))
		n := len(got)
		mu.Unlock()
		if n == 1 {
			// The first POST arrived: the dispatcher dies before it can
			// read the answer and mark the row.
			_ = first.cmd.Process.Kill()
			<-first.done
			close(killed)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(rc.Close)

	keys, err := whsecret.ParseKeys(secretKey)
	require.NoError(t, err)
	ep := uuid.New()
	secret, err := whsecret.NewSecret()
	require.NoError(t, err)
	sealed, err := keys.Seal(secret, tenant, ep.String())
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO webhook_endpoints (id, tenant, url, event_types, secret_sealed) VALUES ($1, $2, $3, $4, $5)`,
		ep, tenant, rc.URL, []string{contract.CloudEventType(contract.EventNoteCreated)}, sealed)
	require.NoError(t, err)

	env := map[string]string{"DATABASE_URL": dbURL, "NATS_URL": srv.URL(), "QUILL_STREAM": streamName, "QUILL_SUBJECT_PREFIX": prefix,
		whsecret.KeyEnv: secretKey, "QUILL_WEBHOOK_ALLOW_PRIVATE": "true", "QUILL_WEBHOOK_TIMEOUT": "1s", "QUILL_ADMIN_ADDR": "127.0.0.1:0"}
	first = startProcess(t, env)

	id := uuid.NewString()
	note := uuid.NewString()
	body := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"/tenants/%s","type":"quill.note.created.v1","subject":%q,"time":%q,"datacontenttype":"application/json","data":{"id":%q,"version":1}}`,
		id, tenant, note, time.Now().UTC().Format(time.RFC3339Nano), note)
	_, err = js.Publish(t.Context(), contract.Subject(prefix, tenant, contract.EventNoteCreated), []byte(body))
	require.NoError(t, err)

	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("the first POST never came")
	}
	state := deliveryState(t, pool, ep, id)
	require.Equal(t, "pending", state, "the killed dispatcher marked nothing")

	startProcess(t, env)
	require.Eventually(t, func() bool { return deliveryState(t, pool, ep, id) == "delivered" }, 30*time.Second, 50*time.Millisecond)
	mu.Lock()
	require.Equal(t, []string{id, id}, got, "the same webhook-id twice")
	mu.Unlock()
	var attempts int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT attempts FROM webhook_deliveries WHERE endpoint_id = $1`, ep).Scan(&attempts))
	require.Equal(t, 2, attempts)

	// The operator commands see it, and refuse to retry what is delivered.
	cmdEnv := map[string]string{"DATABASE_URL": dbURL}
	out, _, code := runCmd(t, cmdEnv, "deliveries", "list", "--state", "delivered", "--tenant", tenant)
	require.Zero(t, code)
	require.Contains(t, out, "event "+id)
	var did int64
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT id FROM webhook_deliveries WHERE endpoint_id = $1`, ep).Scan(&did))
	_, errs, code := runCmd(t, cmdEnv, "deliveries", "retry", fmt.Sprint(did))
	require.NotZero(t, code)
	require.Contains(t, errs, "is delivered, not failed")
	_, errs, code = runCmd(t, cmdEnv, "deliveries", "retry", "999999")
	require.NotZero(t, code)
	require.Contains(t, errs, "no delivery 999999")

	// A failed one of a disabled endpoint: refused until enabled, then
	// pending again.
	_, err = pool.Exec(t.Context(), `UPDATE webhook_deliveries SET state = 'failed', failed_at = now() WHERE id = $1`, did)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO webhook_endpoint_health (endpoint_id, state, disabled_reason) VALUES ($1, 'disabled', 'test')
		ON CONFLICT (endpoint_id) DO UPDATE SET state = 'disabled'`, ep)
	require.NoError(t, err)
	_, errs, code = runCmd(t, cmdEnv, "deliveries", "retry", fmt.Sprint(did))
	require.NotZero(t, code)
	require.Contains(t, errs, "endpoints enable "+ep.String())
	out, _, code = runCmd(t, cmdEnv, "endpoints", "enable", ep.String())
	require.Zero(t, code)
	require.Contains(t, out, "1 failed deliveries")
	out, _, code = runCmd(t, cmdEnv, "deliveries", "retry", "--failed", "--endpoint", ep.String())
	require.Zero(t, code, out)
	require.Contains(t, out, "1 failed deliveries pending again")
	require.Eventually(t, func() bool { return deliveryState(t, pool, ep, id) == "delivered" }, 30*time.Second, 50*time.Millisecond)
}

func deliveryState(t *testing.T, pool *pgxpool.Pool, ep uuid.UUID, id string) string {
	var s string
	_ = pool.QueryRow(context.Background(), `SELECT state FROM webhook_deliveries WHERE endpoint_id = $1 AND event_id = $2`, ep, id).Scan(&s)
	return s
}

// The program in-process: ready once it consumes, and every metric of the
// dispatcher exported from the start.
func TestServesAdminEndpoints(t *testing.T) {
	t.Parallel()
	_, dbURL := dbtest.Pool(t, 2)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	streamName, prefix := "WA_"+strings.ToUpper(suffix), "q"+suffix
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: streamName, Subjects: []string{contract.AllSubjects(prefix)}})
	require.NoError(t, err)
	addr := freeAddr(t)
	env := map[string]string{"DATABASE_URL": dbURL, "NATS_URL": srv.URL(), "QUILL_STREAM": streamName, "QUILL_SUBJECT_PREFIX": prefix,
		whsecret.KeyEnv: secretKey, "QUILL_ADMIN_ADDR": addr}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stderr clitest.SyncBuffer
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, io.Discard, &stderr) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, stderr.String())
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	for _, want := range []string{`quill_webhook_deliveries_total{result="delivered"} 0`, `quill_webhook_deliveries_total{result="refused"} 0`,
		"quill_webhook_pending 0", `quill_webhook_endpoints{state="disabled"} 0`, "quill_webhook_delivery_seconds_count 0", "quill_consumer_pending_messages"} {
		require.Contains(t, string(body), want)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
