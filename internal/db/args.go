package db

import (
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Args holds a transaction's statement parameters, so that handing them
// to pgx boxes a pointer into Args — which costs nothing — instead of
// each value: a create passes about thirty strings, times, ids and byte
// slices, each of which became an allocation of its own as an any
// (issue 29). The types implement pgx's valuer interfaces (TextValuer,
// TimestamptzValuer, UUIDValuer, BytesValuer, Int64Valuer), which the
// codecs of text, timestamptz, uuid, bytea and bigint parameters take as they take the plain
// values, in both formats.
//
// Only a query mode that describes statements knows each parameter's type
// and so its codec; in pgx's exec and simple-protocol modes, and once a
// slab is full, the methods box the plain value instead. The zero Args
// and a nil *Args box plain values too. Values stay valid as long as the
// Args does; use one per transaction, from one goroutine.
type Args struct {
	typed bool
	texts [20]textArg
	times [8]timeArg
	uuids [6]uuidArg
	bytes [4]bytesArg
	ints  [2]int64Arg
	// the slabs' used lengths
	nText, nTime, nUUID, nBytes, nInt int
}

// markTyped records in c's CustomData whether its query mode describes
// statements (typedKey).
func markTyped(c *pgx.Conn) {
	c.PgConn().CustomData()[typedKey] = describes(c.Config().DefaultQueryExecMode)
}

// describes reports whether mode knows the types of a statement's
// parameters before it encodes them.
func describes(mode pgx.QueryExecMode) bool {
	switch mode {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec:
		return true
	}
	return false
}

// Text returns s as a text parameter.
func (a *Args) Text(s string) any {
	if a == nil || !a.typed || a.nText == len(a.texts) {
		return s
	}
	p := &a.texts[a.nText]
	a.nText++
	p.s = s
	return p
}

// Time returns t as a timestamptz parameter.
func (a *Args) Time(t time.Time) any {
	if a == nil || !a.typed || a.nTime == len(a.times) {
		return Time(t)
	}
	p := &a.times[a.nTime]
	a.nTime++
	p.t = t
	return p
}

// UUID returns u as a uuid parameter.
func (a *Args) UUID(u uuid.UUID) any {
	if a == nil || !a.typed || a.nUUID == len(a.uuids) {
		return pgtype.UUID{Bytes: u, Valid: true}
	}
	p := &a.uuids[a.nUUID]
	a.nUUID++
	p.u = u
	return p
}

// Bytes returns b as a bytea parameter (nil is NULL).
func (a *Args) Bytes(b []byte) any {
	if a == nil || !a.typed || a.nBytes == len(a.bytes) || b == nil {
		return b
	}
	p := &a.bytes[a.nBytes]
	a.nBytes++
	p.b = b
	return p
}

// Int64 returns v as a bigint parameter.
func (a *Args) Int64(v int64) any {
	if a == nil || !a.typed || a.nInt == len(a.ints) {
		return v
	}
	p := &a.ints[a.nInt]
	a.nInt++
	p.v = v
	return p
}

type int64Arg struct{ v int64 }

func (i *int64Arg) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: i.v, Valid: true}, nil
}

type textArg struct{ s string }

func (t *textArg) TextValue() (pgtype.Text, error) { return pgtype.Text{String: t.s, Valid: true}, nil }

type timeArg struct{ t time.Time }

func (t *timeArg) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: t.t, Valid: true}, nil
}

type uuidArg struct{ u uuid.UUID }

func (u *uuidArg) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: u.u, Valid: true}, nil }

type bytesArg struct{ b []byte }

func (b *bytesArg) BytesValue() ([]byte, error) { return b.b, nil }
