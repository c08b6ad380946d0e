package db_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// A process's pool size is its default; pool_max_conns in the URL wins, so
// an operator sizes a pool in DATABASE_URL (decision 0076).
func TestPoolSizeFromTheURL(t *testing.T) {
	t.Parallel()
	url := dbtest.Schema(t)
	for _, tc := range []struct {
		url  string
		want int32
	}{
		{url, 16},
		{dbtest.WithParam(t, url, "pool_max_conns", "3"), 3},
	} {
		pool, err := db.Open(t.Context(), tc.url, 16)
		require.NoError(t, err)
		require.Equal(t, tc.want, pool.Config().MaxConns, tc.url)
		pool.Close()
	}
}
