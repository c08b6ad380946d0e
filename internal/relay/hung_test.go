package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/testkit"
)

// A relay that hangs with its connection open — stopped, paused — holds its
// claims for about the lease: PostgreSQL ends its idle claim session
// (idle_session_timeout), and another relay publishes the events.
func TestHungRelaysClaimsEnd(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Lease = 2 * time.Second
	limit := cfg.Lease

	hung, _ := h.newRelay(cfg, h.relayID("hung"))
	require.NoError(t, hung.Provision(h.ctx()))
	conn, space, err := hung.ClaimSession(h.ctx())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for range 3 {
		h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	}
	claimed, err := outbox.Claim(h.ctx(), conn, space, nil, nil, 10)
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	held := time.Now()

	// The hung relay does nothing more. Another relay waits for its claims.
	b, mb := h.newRelay(cfg, h.relayID("b"))
	start(t, b)
	require.Never(t, func() bool { return testkit.Value(mb.Published) > 0 }, limit/2, 50*time.Millisecond,
		"relay b publishes nothing while the hung relay's session lives")
	h.waitPublished(3)
	took := time.Since(held)
	require.GreaterOrEqual(t, took, limit/2)
	require.Less(t, took, limit+5*time.Second, "the claims outlived the lease by far")
	h.requireExactlyOnce(3)
	require.Error(t, conn.Ping(h.ctx()), "PostgreSQL ended the idle claim session")
}
