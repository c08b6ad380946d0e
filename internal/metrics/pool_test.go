package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/testkit"
)

// The pool collector reads a real pool's statistics at each scrape, with
// the pool label.
func TestPoolCollectorExportsPoolStatistics(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 3)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewPoolCollector(metrics.PoolMain, pool))

	main := map[string]string{"pool": "main"}
	require.Equal(t, 3.0, testkit.Gathered(t, reg, "quill_db_pool_max_conns", main))
	conn, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	// Released before the pool closes even when an assertion fails:
	// Close waits for every acquired connection.
	released := false
	t.Cleanup(func() {
		if !released {
			conn.Release()
		}
	})
	require.Equal(t, 1.0, testkit.Gathered(t, reg, "quill_db_pool_acquired_conns", main), "read at the scrape, not at registration")
	acquires := testkit.Gathered(t, reg, "quill_db_pool_acquires_total", main)
	require.GreaterOrEqual(t, acquires, 1.0)
	conn.Release()
	released = true
	require.Equal(t, 0.0, testkit.Gathered(t, reg, "quill_db_pool_acquired_conns", main))
	require.GreaterOrEqual(t, testkit.Gathered(t, reg, "quill_db_pool_total_conns", main), 1.0)

	names := []string{}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		require.True(t, strings.HasPrefix(mf.GetName(), "quill_db_pool_"), mf.GetName())
		require.NotEmpty(t, mf.GetHelp(), mf.GetName())
		for _, m := range mf.GetMetric() {
			require.Equal(t, "main", m.GetLabel()[0].GetValue(), "every series carries its pool")
		}
		names = append(names, mf.GetName())
	}
	require.ElementsMatch(t, []string{
		"quill_db_pool_max_conns", "quill_db_pool_total_conns", "quill_db_pool_acquired_conns", "quill_db_pool_idle_conns",
		"quill_db_pool_constructing_conns", "quill_db_pool_acquires_total", "quill_db_pool_empty_acquires_total",
		"quill_db_pool_canceled_acquires_total", "quill_db_pool_new_conns_total", "quill_db_pool_acquire_seconds_total",
		"quill_db_pool_empty_acquire_wait_seconds_total", "quill_db_pool_destroyed_conns_total",
	}, names, "the names docs/operations.md lists")
}
