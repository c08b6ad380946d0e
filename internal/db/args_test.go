package db_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// Parameters kept in a transaction's Args reach the database as the plain
// values would, in every query mode (the exec and simple-protocol modes
// take the plain values), and more of them than a slab holds spill over
// to plain values.
func TestArgsInEveryQueryMode(t *testing.T) {
	t.Parallel()
	_, u := dbtest.Pool(t, 2)
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456000, time.UTC)
	id := uuid.New()
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pool, err := db.Open(t.Context(), dbtest.WithParam(t, u, "default_query_exec_mode", mode), 1)
			require.NoError(t, err)
			defer pool.Close()
			p, err := db.BeginPipeline(t.Context(), pool)
			require.NoError(t, err)
			defer p.Release()
			a := p.Args()
			var texts []any
			for range 40 { // more than a slab's
				texts = append(texts, a.Text("é'\"x"))
			}
			_, plain := texts[0].(string)
			require.Equal(t, mode == "exec" || mode == "simple_protocol", plain, "a parameter kept in the slab only where the mode describes statements")
			var (
				text, nulled string
				when         time.Time
				gotID        uuid.UUID
				raw, none    []byte
				spilled      string
				big          int64
			)
			p.Batch().Queue(`SELECT $1::text, $2::timestamptz, $3::uuid, $4::bytea, $5::bytea, coalesce(nullif($6::text, ''), 'empty'), $7::text, $8::bigint`,
				texts[0], a.Time(at), a.UUID(id), a.Bytes([]byte{0, 1, 255}), a.Bytes(nil), a.Text(""), texts[39], a.Int64(-1<<62)).
				QueryRow(func(r pgx.Row) error { return r.Scan(&text, &when, &gotID, &raw, &none, &nulled, &spilled, &big) })
			require.NoError(t, p.Commit(t.Context()))
			require.Equal(t, "é'\"x", text)
			require.True(t, at.Equal(when), "%s", when)
			require.Equal(t, id, gotID)
			require.Equal(t, []byte{0, 1, 255}, raw)
			require.Nil(t, none)
			require.Equal(t, "empty", nulled)
			require.Equal(t, "é'\"x", spilled)
			require.Equal(t, int64(-1<<62), big)
		})
	}
	var nilArgs *db.Args
	require.Equal(t, "x", nilArgs.Text("x"), "a nil Args boxes the plain value")
}
