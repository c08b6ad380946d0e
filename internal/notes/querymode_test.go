package notes_test

import (
	"context"
	"io"
	"testing"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
)

// docs/operations.md lets DATABASE_URL name any of pgx's query modes
// (default_query_exec_mode): a create, its replay, a read and a delete work
// in each.
func TestWritesInEveryQueryMode(t *testing.T) {
	t.Parallel()
	_, u := dbtest.Pool(t, 2)
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool, err := db.Open(context.Background(), u+"&default_query_exec_mode="+mode, 2)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			svc, err := notes.NewService(pool, notes.Config{ReplayCacheBytes: -1}, zerolog.New(io.Discard))
			require.NoError(t, err)
			tenant := reviewTenant()
			r := notes.Request{Tenant: tenant, Key: "k", Wait: -1, Render: httpapi.RenderWrite}
			p := notes.CreateParams{Title: "t", Body: "b", Attachment: &notes.NewAttachment{Filename: "a.txt", ContentType: "text/plain",
				Data: []byte("hello"), SHA256: "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"}}
			first, err := svc.Create(t.Context(), r, p)
			require.NoError(t, err)
			require.Equal(t, notes.OutcomeCreated, first.Outcome)
			again, err := svc.Create(t.Context(), r, p)
			require.NoError(t, err)
			require.True(t, again.Replayed)
			require.Equal(t, first.Body, again.Body)
			n := createNote(t, svc, tenant, "k2", "second", nil)
			require.Equal(t, 2, countNotes(t, pool, tenant))
			id, err := uuid.Parse(n.ID)
			require.NoError(t, err)
			del, err := svc.Delete(t.Context(), notes.Request{Tenant: tenant, Key: "d", Wait: -1, Render: httpapi.RenderWrite}, id)
			require.NoError(t, err)
			require.Equal(t, notes.OutcomeDeleted, del.Outcome)
		})
	}
}
