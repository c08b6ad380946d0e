package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/metrics"
)

// /readyz names the failing check with a reason that holds no connection
// details (host, user, database); the detail is logged. A reason Quill's
// own code put in front of a wrapped error, such as the worker's "waiting
// for a relay", is kept.
func TestReadyzHidesDependencyDetails(t *testing.T) {
	t.Parallel()
	// A real pool whose server is not there: its Ping error names the
	// user, the database and the address.
	pool, err := pgxpool.New(t.Context(), "postgres://secretuser@127.0.0.1:1/secretdb?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.ErrorContains(t, pool.Ping(t.Context()), "secretuser", "the raw error holds what must not be shown")

	for _, tc := range []struct {
		name  string
		check metrics.ReadyFunc
		want  string
	}{
		{"pool", metrics.PingReady(pool), "postgres: database unreachable\n"},
		{"operator reason", func(context.Context) error {
			return fmt.Errorf("stream S not found; waiting for a relay to create it: %w", errors.New("nats: stream not found at 10.0.0.7"))
		}, "postgres: stream S not found; waiting for a relay to create it\n"},
		{"bare error", func(context.Context) error { return errors.New("dial 10.0.0.7:5432 as secretuser") }, "postgres: not ready\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			srv := httptest.NewServer(metrics.AdminHandler(zerolog.New(&logs), metrics.NewRegistry(),
				map[string]metrics.ReadyFunc{"postgres": tc.check}))
			t.Cleanup(srv.Close)
			res, err := http.Get(srv.URL + "/readyz")
			require.NoError(t, err)
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
			require.Equal(t, tc.want, string(body))
			require.NotContains(t, string(body), "secret")
			require.NotContains(t, string(body), "10.0.0.7")
			require.Contains(t, logs.String(), `"error_category":"not_ready"`, "the detail is logged")
		})
	}
}
