package outbox

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
)

// TestClaimPlanWalksTheQueue: on a session opened with SessionParams, the
// claim's plan is an ordered walk of the queue's primary key with no sort
// and no sequential scan — even when the statistics were taken on an empty
// queue, as they are when a relay starts on a quiet system and a backlog
// builds up later.
func TestClaimPlanWalksTheQueue(t *testing.T) {
	t.Parallel()
	u := dbtest.Schema(t)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(u)
	require.NoError(t, err)
	plan := func(params map[string]string) string {
		c := cfg.Copy()
		for k, v := range params {
			c.RuntimeParams[k] = v
		}
		conn, err := pgx.ConnectConfig(ctx, c)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `ANALYZE outbox_pending`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `ANALYZE outbox_events`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `PREPARE claim(int4, int, bigint[]) AS `+sqlClaimLock)
		require.NoError(t, err)
		var out []byte
		require.NoError(t, conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE claim(1, 256, '{}')`).Scan(&out))
		var doc []map[string]any
		require.NoError(t, json.Unmarshal(out, &doc))
		var nodes []string
		var walk func(n map[string]any)
		walk = func(n map[string]any) {
			nodes = append(nodes, n["Node Type"].(string)+" "+strOr(n["Index Name"]))
			if kids, ok := n["Plans"].([]any); ok {
				for _, k := range kids {
					walk(k.(map[string]any))
				}
			}
		}
		walk(doc[0]["Plan"].(map[string]any))
		return strings.Join(nodes, "; ")
	}

	got := plan(SessionParams())
	require.Contains(t, got, "Index Scan outbox_pending_pkey", "the claim walks the queue by seq: %s", got)
	require.NotContains(t, got, "Sort", "no sort of the queue: %s", got)
	require.NotContains(t, got, "Seq Scan", "no sequential scan: %s", got)
	t.Logf("with SessionParams: %s", got)
	// For comparison (not asserted: it depends on the server's version and
	// cost settings): the plan of a session without them.
	t.Logf("without: %s", plan(map[string]string{"plan_cache_mode": "force_generic_plan"}))
}

func strOr(v any) string {
	s, _ := v.(string)
	return s
}
