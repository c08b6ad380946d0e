package webhooks_test

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/webhooks"
	"github.com/quillhq/quill/internal/whsecret"
)

// The webhook routes take the tenant's turn at the pool the notes'
// traffic shares (db.Fair): while another tenant holds the pool's only
// turn, a read waits for it, past the acquire timeout an ErrPoolTimeout;
// once it is given back, the read goes.
func TestReadsTakeTheTenantsTurn(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 1)
	cfg := notes.Config{AcquireTimeout: 200 * time.Millisecond}
	ns, err := notes.NewService(pool, cfg, zerolog.Nop())
	require.NoError(t, err)
	keys, err := whsecret.ParseKeys("a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=")
	require.NoError(t, err)
	ws, err := webhooks.NewService(pool, cfg, keys, zerolog.Nop(), webhooks.WithTurns(ns.Turn))
	require.NoError(t, err)

	release, err := ns.Turn(t.Context(), "globex")
	require.NoError(t, err)
	_, err = ws.List(t.Context(), "acme")
	require.ErrorIs(t, err, db.ErrPoolTimeout, "the pool's one turn is globex's")

	release()
	got, err := ws.List(t.Context(), "acme")
	require.NoError(t, err)
	require.Empty(t, got)
}
