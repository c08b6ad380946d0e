package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/webhooktest"
)

// TestDemo runs `make demo` — scripts/demo.sh — against the real system,
// the webhook dispatcher included, without faults other than the one the
// demo injects itself: it must tell the whole story and exit 0. Its own
// checks decide that: a replay after the dropped response, one note, the
// event published with a stream sequence, the attachment processed, 422
// for the changed request, a second note under a new key; then an
// endpoint registered at a receiver on this machine, a delivery that the
// Standard Webhooks npm package verified, and its webhook effect delivered
// in the lookup.
func TestDemo(t *testing.T) {
	// Not parallel: each e2e test runs every program and a PostgreSQL
	// cluster of its own, and the fault suite's time limits assume it has
	// the machine to itself.
	if testing.Short() {
		t.Skip("e2e: runs the real programs; skipped with -short")
	}
	if _, err := exec.LookPath("node"); err != nil && os.Getenv("CI") != "true" {
		t.Skipf("the demo's webhook part needs node: %s", webhooktest.Install)
	}
	seed := randomSeed()
	s := setup(t, profile{Name: "demo"}, seed, fmt.Sprintf("demo%08x", uint32(seed)), topology{APIs: 1, Relays: 1, Workers: 1})
	startDispatcher(t, s, "webhook-dispatcher")
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), "bash", filepath.Join(root, "scripts", "demo.sh"))
	cmd.Dir = root
	cmd.Env = append(cleanEnv(), "QUILL_URL="+s.apiURL, "QUILL_TOKEN="+s.tenants[0].Token, "QUILL_DEMO_WAIT=60s")
	if goBin, err := exec.LookPath("go"); err != nil {
		// The script builds with go; a test run by an absolute path to go
		// may have no go in PATH.
		cmd.Env = append(cmd.Env, "GO="+filepath.Join(os.Getenv("GOROOT"), "bin", "go"))
	} else {
		cmd.Env = append(cmd.Env, "GO="+goBin)
	}
	out, err := cmd.CombinedOutput()
	t.Logf("demo output:\n%s", out)
	require.NoError(t, err, "the demo failed")
	for _, want := range []string{
		"Idempotent-Replayed: true",
		"stream sequence",
		"processed",
		"422 idempotency_key_reused, fields [title]",
		"now: 2",
		"Every step behaved as promised.",
		"POST /v1/webhooks → 201",
		"signature verified",
		`"kind":"webhook"`,
		`"state":"delivered"`,
		"The webhook was delivered, verified by the Standard Webhooks library, and the lookup says so.",
	} {
		require.Contains(t, string(out), want)
	}
}
