package db_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
)

func TestInsertRendering(t *testing.T) {
	ins := db.Insert{Table: "t", Columns: []db.Column{{Name: "a", Type: "uuid"}, {Name: "b", Type: "text", NullIfEmpty: true}}}
	for _, tc := range []struct {
		name, want string
		got        func() string
	}{
		{"guarded by a relation", `INSERT INTO t (a, b) SELECT $4::uuid, nullif($5::text, '') FROM claim WHERE claim.claimed`,
			func() string {
				sql, next := ins.AppendGuarded(nil, "claim", "claimed", 4)
				require.Equal(t, 6, next)
				return string(sql)
			}},
		{"appended", `x, INSERT INTO t (a, b) SELECT $1::uuid, nullif($2::text, '') FROM r WHERE r.c`,
			func() string { sql, _ := ins.AppendGuarded([]byte("x, "), "r", "c", 1); return string(sql) }},
		{"plain", `INSERT INTO t (a, b) VALUES ($1::uuid, nullif($2::text, ''))`, ins.Values},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, tc.got()) })
	}
}
