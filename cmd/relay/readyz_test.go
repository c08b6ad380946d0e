package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/testkit"
)

// TestDaemonNotReadyWhilePostgresIsDown: the relay's /readyz answers 503,
// naming PostgreSQL, while the database is unreachable (NATS is up), and 200
// again once it is back; the events committed meanwhile are then published,
// and the process stops cleanly.
func TestDaemonNotReadyWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cut, proxied := dbtest.NewSwitch(t, w.vars["DATABASE_URL"])
	w.vars["DATABASE_URL"] = proxied // the relay's; the test writes straight to the server
	p := clitest.Start(t, run, clitest.Env(w.vars))
	readyz := "http://" + w.admin + "/readyz"
	waitStatus(t, readyz, http.StatusOK)
	w.write(w.tenant)
	w.waitPublished(1)

	cut.Set(dbtest.Refused)
	body := waitStatus(t, readyz, http.StatusServiceUnavailable)
	require.Contains(t, body, "postgres")
	t.Logf("/readyz while PostgreSQL is down: %s", body)
	testkit.WaitFor(t, waitLong, func() bool {
		return strings.Contains(p.Stderr.String(), `"error_category":"database_unavailable"`)
	}, "the relay to log that PostgreSQL is unavailable")
	res, err := http.Get(readyz)
	require.NoError(t, err)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "still down: still not ready")
	require.Contains(t, string(b), "postgres")
	for range 2 {
		w.write(w.tenant)
	}

	cut.Set(dbtest.Up)
	waitStatus(t, readyz, http.StatusOK)
	w.waitPublished(3)
	require.Len(t, w.streamIDs(), 3)

	require.NoError(t, p.Stop(), "a graceful stop")
	require.NotContains(t, p.Stderr.String(), `"level":"error"`)
}
