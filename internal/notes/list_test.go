package notes_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
)

// List stops reading once the notes read hold maxBytes of title and body,
// returning a cursor that goes on from the last note it read, so a page of
// large notes is not read into memory whole; it returns at least one note,
// and without a byte bound it reads up to limit.
func TestListStopsAtTheByteBound(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	svc := reviewService(t, pool, time.Second)
	tenant := reviewTenant()
	var ids []uuid.UUID // newest first, as List answers
	for range 4 {
		id, err := uuid.NewV7()
		require.NoError(t, err)
		_, err = pool.Exec(t.Context(), `INSERT INTO notes (id, tenant, title, body, created_at) VALUES ($1, $2, 't', $3, now())`,
			id, tenant, strings.Repeat("b", 600))
		require.NoError(t, err)
		ids = append([]uuid.UUID{id}, ids...)
	}
	ctx := t.Context()

	list, next, err := svc.List(ctx, tenant, 100, nil, 1000)
	require.NoError(t, err)
	require.Len(t, list, 2, "600 bytes are under the bound, 1,200 past it")
	require.Equal(t, ids[1], *next)
	list, next, err = svc.List(ctx, tenant, 100, next, 1000)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{ids[2], ids[3]}, []uuid.UUID{list[0].ID, list[1].ID})
	require.Nil(t, next, "the last page, although it reached the bound")

	list, _, err = svc.List(ctx, tenant, 100, nil, 10)
	require.NoError(t, err)
	require.Len(t, list, 1, "one note however large")
	list, next, err = svc.List(ctx, tenant, 100, nil, 0)
	require.NoError(t, err)
	require.Len(t, list, 4)
	require.Nil(t, next)
}
