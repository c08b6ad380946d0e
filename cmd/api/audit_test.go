package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
)

// auditJSON is the machine output the fault suite relies on.
type auditJSON struct {
	Anomalies []map[string]any `json:"anomalies"`
	Counts    struct {
		Operations           int64 `json:"operations"`
		Requests             int64 `json:"requests"`
		Replays              int64 `json:"replays"`
		DuplicatesSuppressed struct {
			APIReplays int64 `json:"api_replays"`
			Total      int64 `json:"total"`
		} `json:"duplicates_suppressed"`
	} `json:"counts"`
	Stream struct {
		Checked bool   `json:"checked"`
		Reason  string `json:"reason"`
	} `json:"stream"`
	Chains []map[string]any `json:"chains"`
}

func runAudit(t *testing.T, getenv func(string) string, args ...string) (auditJSON, string, int) {
	t.Helper()
	out, _, err := clitest.RunOut(t, run, getenv, append([]string{"audit", "--json"}, args...)...)
	var stderr bytes.Buffer
	code := exitCode(err, &stderr)
	var rep auditJSON
	if out != "" {
		require.NoError(t, json.Unmarshal([]byte(out), &rep, json.RejectUnknownMembers(false)), out)
	}
	return rep, stderr.String(), code
}

// Replays through the HTTP API reach operations.replays (flushed at
// shutdown), and api audit reports them; exit 0 while consistent, 1 with the
// anomaly in JSON once an operation record is removed.
func TestAuditCommand(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "AUDIT_CMD", Subjects: []string{"qaudit.>"}, MaxAge: time.Hour})
	require.NoError(t, err)
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"NATS_URL": srv.URL(), "QUILL_STREAM": "AUDIT_CMD", "QUILL_SUBJECT_PREFIX": "qaudit"}
	getenv := clitest.Env(vars)
	tok := createToken(t, getenv)

	p := startServe(t, vars)
	base := "http://" + vars["QUILL_HTTP_ADDR"]
	res, body := post(t, base, tok, "audit-1", `{"title":"a"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode, body)
	for range 2 {
		res, _ = post(t, base, tok, "audit-1", `{"title":"a"}`)
		require.Equal(t, "true", res.Header.Get("Idempotent-Replayed"))
	}
	require.NoError(t, p.Stop())

	conn, err := pgx.Connect(ctx, vars["DATABASE_URL"])
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	var replays int
	require.NoError(t, conn.QueryRow(ctx, `SELECT replays FROM operations WHERE key = 'audit-1'`).Scan(&replays))
	require.Equal(t, 2, replays, "the replays answered before shutdown were flushed")

	rep, stderr, code := runAudit(t, getenv)
	require.Equal(t, 0, code, stderr)
	require.Empty(t, rep.Anomalies)
	require.True(t, rep.Stream.Checked)
	require.EqualValues(t, 1, rep.Counts.Operations)
	require.EqualValues(t, 2, rep.Counts.Replays)
	require.EqualValues(t, 3, rep.Counts.Requests)
	require.EqualValues(t, 2, rep.Counts.DuplicatesSuppressed.APIReplays)

	// The key's chain, in text.
	out, _, err := clitest.RunOut(t, run, getenv, "audit", "--tenant", "acme", "--key", "audit-1")
	require.NoError(t, err)
	require.Contains(t, out, "acme/audit-1  create-note completed 201")
	require.Contains(t, out, "note.created")
	require.Contains(t, out, "RESULT: consistent")

	_, err = conn.Exec(ctx, `DELETE FROM operations`)
	require.NoError(t, err)
	rep, _, code = runAudit(t, getenv)
	require.Equal(t, 1, code)
	require.NotEmpty(t, rep.Anomalies)
	for _, x := range rep.Anomalies {
		for _, f := range []string{"kind", "tenant", "key", "event_id", "detail"} {
			require.Contains(t, x, f)
		}
	}
	require.Equal(t, "orphan_effect", rep.Anomalies[0]["kind"])
	require.Equal(t, "acme", rep.Anomalies[0]["tenant"])
	require.Equal(t, "audit-1", rep.Anomalies[0]["key"])
	require.NotEmpty(t, rep.Chains)

	// NATS unreachable: the database checks still report (exit 1 here);
	// without anomalies the audit is incomplete (exit 3), not clean.
	down := func(k string) string {
		if k == "NATS_URL" {
			return "nats://127.0.0.1:1"
		}
		return getenv(k)
	}
	rep, _, code = runAudit(t, down)
	require.Equal(t, 1, code)
	require.False(t, rep.Stream.Checked)
	require.Contains(t, rep.Stream.Reason, "not reachable")
	rep, stderr, code = runAudit(t, down, "--tenant", "other")
	require.Equal(t, 3, code)
	require.Empty(t, rep.Anomalies)
	require.Contains(t, stderr, "audit incomplete")
	_, _, code = runAudit(t, down, "--tenant", "other", "--no-stream")
	require.Equal(t, 0, code, "--no-stream skips the stream on purpose")
}

func TestAuditCommandErrors(t *testing.T) {
	t.Parallel()
	getenv := clitest.Env(map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/quill?sslmode=disable&connect_timeout=2"})
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"audit", "--key", "k"}, 2, "--key needs --tenant"},
		{[]string{"audit", "--tenant", "Bad_Name"}, 2, "tenant"},
		{[]string{"audit", "--tenant", "acme", "--key", "has space"}, 2, "--key"},
		{[]string{"audit", "--pending-threshold", "soon"}, 2, "pending-threshold"},
		{[]string{"audit", "extra"}, 2, "unexpected arguments"},
		// Bad NATS settings are usage errors, before the database is read.
		{[]string{"audit", "--nats-url", "nats://n1:4222,,nats://n3:4222"}, 2, `invalid --nats-url "nats://n1:4222,,nats://n3:4222": server 2 of 3 is empty`},
		{[]string{"audit", "--nats-creds", "/nonexistent/user.creds"}, 2, `invalid --nats-creds "/nonexistent/user.creds"`},
		{[]string{"audit", "--nats-tls-cert", "audit.go"}, 2, "QUILL_NATS_TLS_CERT is set without QUILL_NATS_TLS_KEY"},
		{[]string{"audit"}, 3, "cannot read the database"},
		{[]string{"audit", "--help"}, 0, ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := clitest.RunOut(t, run, getenv, tc.args...)
			var stderr bytes.Buffer
			require.Equal(t, tc.code, exitCode(err, &stderr), "err: %v", err)
			if tc.want != "" {
				require.Contains(t, stderr.String(), tc.want)
				require.NotContains(t, strings.TrimSpace(stderr.String()), "\n", "one line")
			}
		})
	}
}
