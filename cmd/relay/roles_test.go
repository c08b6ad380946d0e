package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
)

// TestDaemonUnderTheRuntimeRole: a relay connected as the runtime role of
// deploy/postgres/roles.sql (the schema migrated by its owner) claims,
// publishes and marks events, and its retention pass runs.
func TestDaemonUnderTheRuntimeRole(t *testing.T) {
	t.Parallel()
	r := dbtest.Roles(t)
	_, err := dbtest.Migrate(t.Context(), r.Owner)
	require.NoError(t, err)
	pool, err := pgxpool.New(t.Context(), r.Runtime)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	w := &world{t: t, pool: pool, srv: srv, js: js, suffix: suffix,
		stream: "RELAY_" + strings.ToUpper(suffix), prefix: "q" + suffix, tenant: "acme-" + suffix, admin: clitest.FreeAddr(t)}
	w.vars = map[string]string{"DATABASE_URL": r.Runtime, "NATS_URL": srv.URL(), "QUILL_ADMIN_ADDR": w.admin,
		"QUILL_STREAM": w.stream, "QUILL_SUBJECT_PREFIX": w.prefix}
	p := clitest.Start(t, run, clitest.Env(w.vars))
	waitStatus(t, "http://"+w.admin+"/readyz", http.StatusOK)
	for range 3 {
		w.write(w.tenant)
	}
	w.waitPublished(3)
	require.Len(t, w.streamIDs(), 3)
	require.NoError(t, p.Stop())
	logs := p.Stderr.String()
	require.NotContains(t, logs, `"level":"error"`)
	require.NotContains(t, logs, "permission denied")
}
