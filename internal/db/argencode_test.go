package db_test

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// A write group's parameters are encoded byte for byte as pgx's
// ExtendedQueryBuilder encodes them — formats, NULLs, the fallback to the
// other format, the errors — for several statements in one transaction,
// and again after a reset, in buffers kept between them.
func TestArgEncoderEncodesAsPgx(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	ctx := t.Context()
	// A transaction's Args, whose values are kept in its slab.
	p, err := db.BeginPipeline(ctx, pool)
	require.NoError(t, err)
	defer p.Release()
	pc, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer pc.Release()
	conn := pc.Conn()
	_, err = conn.Exec(ctx, `CREATE TEMP TABLE enc (a text, b jsonb)`)
	require.NoError(t, err)
	typed, err := conn.Prepare(ctx, "enc_typed", `SELECT $1::text, $2::bytea, $3::jsonb, $4::uuid, $5::timestamptz, $6::int8, $7::int4, $8::bool, $9::text[]`)
	require.NoError(t, err)
	insert, err := conn.Prepare(ctx, "enc_insert", `INSERT INTO enc VALUES ($1, $2)`)
	require.NoError(t, err)
	m := conn.TypeMap()
	a := p.Args()
	at := time.Date(2026, 12, 3, 16, 0, 0, 123456000, time.UTC)
	id := uuid.New()
	s := "é'\"x"
	body := make([]byte, 3000) // past the 256 bytes pgx keeps
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	cases := []struct {
		name string
		sd   *pgconn.StatementDescription
		args []any
	}{
		{"plain values", typed, []any{"x", []byte{0, 1, 2}, []byte(`{"a":1}`), id, at, int64(1 << 40), int32(7), true, []string{"a", "b"}}},
		{"the transaction's Args", typed, []any{a.Text(s), a.Bytes(body), a.Bytes([]byte(`{"b":[1,2]}`)), a.UUID(id), a.Time(at), a.Int64(-5), 0, false, []string{}}},
		{"NULLs", typed, []any{nil, nil, nil, nil, nil, nil, nil, nil, nil}},
		// A string goes in text whatever the type prefers.
		{"strings", typed, []any{"x", `\x0102`, `{"a":1}`, id.String(), at.Format(time.RFC3339Nano), "42", "7", "true", "{c}"}},
		{"pointers", typed, []any{&s, (*string)(nil), json.RawMessage(`"s"`), id.String(), at.Format(time.RFC3339Nano), "42", "7", "true", "{c}"}},
		// Nils of the types the case before gave each parameter a plan for.
		{"nil pointers after pointers", typed, []any{(*string)(nil), &s, json.RawMessage(nil), id.String(), at.Format(time.RFC3339Nano), "42", "7", "true", "{c}"}},
		// A nil whose pointer type is a driver.Valuer: pgx asks it for
		// its value, which a plan for the type would not.
		{"a valuer", typed, []any{&nilValuer{}, nil, nil, nil, nil, nil, nil, nil, nil}},
		{"a nil valuer", typed, []any{(*nilValuer)(nil), nil, nil, nil, nil, nil, nil, nil, nil}},
		// Values the codecs turn into binary from their text, and
		// (never executed) ones whose text they cannot parse, so encoded
		// in text after binary failed.
		{"binary from text", typed, []any{nil, nil, nil, textOnly("00000000-0000-0000-0000-000000000001"), nil, textOnly("42"), pgtype.Text{String: "7", Valid: true}, textOnly("t"), nil}},
		{"the other format", typed, []any{nil, nil, nil, textOnly("not a uuid"), nil, textOnly("not a number"), pgtype.Text{String: "seven", Valid: true}, textOnly("maybe"), nil}},
		{"a statement without result columns", insert, []any{string(body), []byte(`[]`)}},
		{"an empty string", insert, []any{"", nil}},
	}
	var enc db.ArgEncoder
	for round := range 2 {
		enc.Reset()
		// Each case twice in a row: the second by the plans the first
		// left (the encoder keeps a plan per parameter and argument
		// type), the first by those of the case before, of other types.
		for i, c := range cases {
			var eqb pgx.ExtendedQueryBuilder
			require.NoError(t, eqb.Build(m, c.sd, c.args), c.name)
			for again := range 2 {
				require.NoError(t, enc.Add(m, c.sd, c.args), c.name)
				values, formats, results := enc.Stmt(2*i + again)
				requireSameValues(t, eqb.ParamValues, values, "round %d, %d: %s", round, again, c.name)
				require.True(t, slices.Equal(eqb.ParamFormats, formats), "round %d, %d: %s: formats %v, pgx's %v", round, again, c.name, formats, eqb.ParamFormats)
				require.True(t, slices.Equal(eqb.ResultFormats, results), "round %d, %d: %s: result formats %v, pgx's %v", round, again, c.name, results, eqb.ResultFormats)
			}
		}
		// The earlier statements' bytes are still theirs.
		for i, c := range cases {
			var eqb pgx.ExtendedQueryBuilder
			require.NoError(t, eqb.Build(m, c.sd, c.args))
			for again := range 2 {
				values, _, _ := enc.Stmt(2*i + again)
				requireSameValues(t, eqb.ParamValues, values, "round %d, %d, afterwards: %s", round, again, c.name)
			}
		}
	}
	// What pgx refuses is refused, and leaves nothing behind.
	for _, args := range [][]any{
		{struct{}{}, nil, nil, nil, nil, nil, nil, nil, nil},
		{"x", nil, nil, 12, nil, nil, nil, nil, nil},
		{"too few"},
	} {
		var eqb pgx.ExtendedQueryBuilder
		want := eqb.Build(m, typed, args)
		require.Error(t, want)
		enc.Reset()
		require.NoError(t, enc.Add(m, insert, []any{"kept", nil}))
		got := enc.Add(m, typed, args)
		require.EqualError(t, got, want.Error())
		values, _, _ := enc.Stmt(0)
		requireSameValues(t, [][]byte{[]byte("kept"), nil}, values, "after %v", args)
		require.NoError(t, enc.Add(m, insert, []any{"next", nil}))
		values, _, _ = enc.Stmt(1)
		requireSameValues(t, [][]byte{[]byte("next"), nil}, values, "after %v", args)
	}
}

// nilValuer is a driver.Valuer on its pointer, which answers for a nil.
type nilValuer struct{}

func (v *nilValuer) Value() (driver.Value, error) {
	if v == nil {
		return "nil's own", nil
	}
	return "a value", nil
}

// textOnly is a parameter only its text format takes.
type textOnly string

func (v textOnly) Value() (driver.Value, error) { return string(v), nil }

// requireSameValues fails t unless got holds want's parameters: the same
// bytes, and NULL (nil) exactly where want has it.
func requireSameValues(t *testing.T, want, got [][]byte, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want), append([]any{msg}, args...)...)
	for i := range want {
		require.Equal(t, want[i] == nil, got[i] == nil, append([]any{msg + ": parameter %d is NULL in one only"}, append(args, i)...)...)
		require.True(t, bytes.Equal(want[i], got[i]), append([]any{msg + ": parameter %d: %q, pgx's %q"}, append(args, i, got[i], want[i])...)...)
	}
}
