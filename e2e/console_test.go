package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/testkit"
)

// TestConsoleInABrowser drives the operator console in Chromium (Playwright,
// e2e/console/console.cjs) against the real programs — api (with the
// console on its admin address), relay and attachment-worker — on a fresh
// database and their own nats-server: sign in (a tenant token refused),
// look up a key created through the API and see every link of its chain,
// see a parked event and retry it, refuse an action posted from another
// site, enable a disabled webhook endpoint and re-send its failed
// delivery, and refuse a signed-out session's cookie put back.
//
// It needs node, npm and Chromium (scripts/ensure-playwright.sh installs
// them when run as root); without them it is skipped, except under CI=true,
// where .ci/run has installed them and a skip would hide a broken console.
// QUILL_CONSOLE_SCREENSHOTS=DIR keeps the pages' screenshots (docs/console/
// holds those of a run).
func TestConsoleInABrowser(t *testing.T) {
	nodePath, err := exec.Command("bash", filepath.Join("..", "scripts", "ensure-playwright.sh")).Output()
	if err != nil {
		msg := fmt.Sprintf("the console's browser test needs node, npm, Chromium and playwright-core: %v", err)
		if ee, ok := err.(*exec.ExitError); ok {
			msg += ": " + strings.TrimSpace(string(ee.Stderr))
		}
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ctx := t.Context()
	dir := t.TempDir()
	bins := buildBinaries(t, filepath.Join(dir, "bin"))
	ns := startNATS(t, bins.nats, dir)
	dbURL := dbtest.Database(t)

	base := cleanEnv()
	withDB := slices.Concat(base, []string{"DATABASE_URL=" + dbURL})
	runOK(t, bins.api, withDB, "migrate")
	tenant := "console-e2e"
	tenantToken := strings.TrimSpace(runOK(t, bins.api, withDB, "token", "create", "--tenant", tenant))
	opToken := strings.TrimSpace(runOK(t, bins.api, withDB, "token", "create", "--operator", "--name", "e2e-operator"))

	port := func() string { return fmt.Sprintf("127.0.0.1:%d", freePort(t)) }
	httpAddr, consoleAddr := port(), port()
	common := slices.Concat(withDB, []string{"NATS_URL=" + ns.URL(), "QUILL_LOG_LEVEL=info"})
	daemons := []*daemon{
		newDaemon("api", bins.api, consoleAddr, filepath.Join(dir, "api.log"),
			slices.Concat(common, []string{"QUILL_HTTP_ADDR=" + httpAddr, "QUILL_ADMIN_ADDR=" + consoleAddr, "QUILL_CONSOLE=true"}), "serve"),
	}
	for _, role := range []struct{ name, bin string }{{"relay", bins.relay}, {"attachment-worker", bins.worker}} {
		admin := port()
		daemons = append(daemons, newDaemon(role.name, role.bin, admin, filepath.Join(dir, role.name+".log"),
			slices.Concat(common, []string{"QUILL_ADMIN_ADDR=" + admin}), "run"))
	}
	for _, d := range daemons {
		go d.Run()
		t.Cleanup(func() { _ = d.Stop(30 * time.Second) })
	}
	for _, d := range daemons {
		require.NoError(t, d.WaitHealthy(ctx, time.Minute))
	}
	pool, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close(context.Background())

	create := func(key, title string, att []byte) string {
		body := map[string]any{"title": title, "body": "written by the console's browser test"}
		if att != nil {
			body["attachment"] = map[string]string{"filename": "pixel.png", "content_type": "image/png", "data": base64.StdEncoding.EncodeToString(att)}
		}
		b, err := json.Marshal(body)
		require.NoError(t, err)
		resp, _ := apitest.PostNote(ctx, t, "http://"+httpAddr, tenantToken, key, b)
		require.Contains(t, []int{http.StatusCreated, http.StatusOK}, resp.StatusCode)
		return strings.TrimPrefix(resp.Header.Get("Location"), "/v1/notes/")
	}
	query := func(sql string, args ...any) (s string) {
		if err := pool.QueryRow(ctx, sql, args...).Scan(&s); err != nil {
			return ""
		}
		return s
	}

	// Chain A: created, replayed (the API's replay counter writes the count
	// within a second), published, processed with its thumbnail, and its
	// attachment.processed event published.
	noteA := create("console-a", "chain A", attachment.BenchFixturePNG64K())
	require.Equal(t, noteA, create("console-a", "chain A", attachment.BenchFixturePNG64K()))
	testkit.WaitFor(t, time.Minute, func() bool {
		return query(`SELECT (a.status = 'processed' AND o.replays = 1 AND NOT EXISTS (SELECT 1 FROM outbox_pending))::text
			FROM attachments a JOIN operations o ON o.tenant = a.tenant AND o.key = 'console-a' WHERE a.note_id = $1`, noteA) == "true"
	}, "chain A processed, replayed and published whole")

	// Chain B: the stream takes no message of its size, so the relay parks
	// its event; then the stream is allowed any size again (the relay owns
	// none of that setting: decision 0032), so a retry can publish it.
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	setMaxMsgSize := func(n int32) {
		s, err := js.Stream(ctx, contract.DefaultStream)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.MaxMsgSize = n
		_, err = js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	setMaxMsgSize(64)
	noteB := create("console-b", "chain B", nil)
	testkit.WaitFor(t, time.Minute, func() bool {
		return query(`SELECT (parked_at IS NOT NULL)::text FROM outbox_events WHERE aggregate_id = $1`, noteB) == "true"
	}, "chain B's event parked")
	eventB := query(`SELECT id::text FROM outbox_events WHERE aggregate_id = $1`, noteB)
	setMaxMsgSize(-1)

	// Webhooks: an endpoint the dispatcher disabled (a 410) and its failed
	// delivery, as it leaves them (no dispatcher runs here: the re-sent
	// delivery stays pending).
	hookEndpoint := query(`INSERT INTO webhook_endpoints (id, tenant, url, event_types, secret_sealed)
		VALUES (gen_random_uuid(), $1, 'https://hooks.example/quill', '{note.created}', '\x00') RETURNING id::text`, tenant)
	require.NotEmpty(t, hookEndpoint)
	_, err = pool.Exec(ctx, `INSERT INTO webhook_endpoint_health (endpoint_id, state, disabled_at, disabled_reason, last_attempt_at, last_status, last_error, failures_in_row, failing_since)
		VALUES ($1, 'disabled', now(), 'answered 410 Gone', now(), 410, 'answered 410 Gone', 1, now())`, hookEndpoint)
	require.NoError(t, err)
	hookDelivery := query(`INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, attempts, last_status, last_error, failed_at)
		VALUES ($1, $2, gen_random_uuid(), 'note.created', '{}', now(), 'failed', 1, 410, 'answered 410 Gone', now()) RETURNING id::text`, tenant, hookEndpoint)
	require.NotEmpty(t, hookDelivery)

	shots := os.Getenv("QUILL_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = filepath.Join(dir, "screenshots")
	}
	require.NoError(t, os.MkdirAll(shots, 0o755))
	nctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(nctx, "node", filepath.Join("console", "console.cjs"))
	cmd.Env = append(os.Environ(), "NODE_PATH="+strings.TrimSpace(string(nodePath)), "CONSOLE_URL=http://"+consoleAddr,
		"SCREENSHOTS="+shots, "TENANT="+tenant, "TENANT_TOKEN="+tenantToken, "OPERATOR_TOKEN="+opToken,
		"KEY_A=console-a", "NOTE_A="+noteA, "EVENT_B="+eventB, "HOOK_ENDPOINT="+hookEndpoint, "HOOK_DELIVERY="+hookDelivery)
	out, err := cmd.CombinedOutput()
	t.Logf("browser:\n%s", out)
	if err != nil {
		t.Logf("api log:\n%s", tail(filepath.Join(dir, "api.log"), 30))
	}
	require.NoError(t, err, "the browser test failed; screenshots in %s", shots)

	// What the browser did happened: the retried event is published, and
	// the API logged each action with the operator's name.
	require.Equal(t, "true", query(`SELECT (published_at IS NOT NULL)::text FROM outbox_events WHERE id = $1`, eventB))
	require.Equal(t, "active", query(`SELECT state FROM webhook_endpoint_health WHERE endpoint_id = $1`, hookEndpoint))
	require.Equal(t, "pending", query(`SELECT state FROM webhook_deliveries WHERE id = $1`, hookDelivery))
	apiLog, err := os.ReadFile(filepath.Join(dir, "api.log"))
	require.NoError(t, err)
	for _, action := range []string{"signin", "lookup", "retry_parked", "enable_webhook_endpoint", "retry_webhook_failed", "signout"} {
		require.Contains(t, string(apiLog), `"console_action":"`+action+`"`)
	}
	require.Contains(t, string(apiLog), `"operator":"e2e-operator"`)
	require.Contains(t, string(apiLog), `"error_category":"console_cross_origin"`)
	require.Contains(t, string(apiLog), `"error_category":"console_tenant_token"`)
}
