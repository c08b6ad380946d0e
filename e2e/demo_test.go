package e2e

import (
	"fmt"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemo runs `make demo`'s program against the real system, without
// faults other than the one the demo injects itself: it must tell the whole
// story and exit 0 — its own checks (a replay after the dropped response,
// one note, the event published with a stream sequence, the attachment
// processed, 422 for the changed request, a second note under a new key)
// decide that.
func TestDemo(t *testing.T) {
	// Not parallel: each e2e test runs every program and a PostgreSQL
	// cluster of its own, and the fault suite's time limits assume it has
	// the machine to itself.
	if testing.Short() {
		t.Skip("e2e: runs the real programs; skipped with -short")
	}
	seed := randomSeed()
	s := setup(t, profile{Name: "demo"}, seed, fmt.Sprintf("demo%08x", uint32(seed)), topology{APIs: 1, Relays: 1, Workers: 1})
	cmd := exec.CommandContext(t.Context(), s.bins.demo)
	cmd.Env = append(cleanEnv(), "QUILL_URL="+s.apiURL, "QUILL_TOKEN="+s.tenants[0].Token, "QUILL_DEMO_WAIT=60s")
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
	} {
		require.Contains(t, string(out), want)
	}
}
