package db_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// BenchmarkPipelineCommit is the shape of a create: one pipelined round
// trip of BEGIN, the session settings, an insert and COMMIT, in each query
// mode and route worth comparing.
func BenchmarkPipelineCommit(b *testing.B) {
	direct := dbtest.Schema(b)
	for _, bc := range []struct{ name, url string }{
		{"direct/cache_statement", direct},
		{"direct/cache_describe", dbtest.WithParam(b, direct, "default_query_exec_mode", "cache_describe")},
		{"direct/exec", dbtest.WithParam(b, direct, "default_query_exec_mode", "exec")},
		{"pgbouncer/cache_describe", dbtest.PgBouncer(b, direct)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := b.Context()
			pool, err := db.Open(ctx, bc.url, 4)
			require.NoError(b, err)
			defer pool.Close()
			_, err = pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS bench_commit (id bigserial PRIMARY KEY, v text NOT NULL)")
			require.NoError(b, err)
			for b.Loop() {
				p, err := db.BeginPipeline(ctx, pool)
				require.NoError(b, err)
				p.Batch().Queue("INSERT INTO bench_commit (v) VALUES ($1)", "x")
				require.NoError(b, p.Commit(ctx))
				p.Release()
			}
		})
	}
}
