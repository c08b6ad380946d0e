package db

import (
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Column is one column of an Insert: its name, the SQL type its parameter
// is cast to, and whether an empty string is stored as NULL.
type Column struct {
	Name        string
	Type        string
	NullIfEmpty bool
}

// Insert describes the insert of one row into a table, as the package that
// owns the table knows it: names and types, never SQL text. Another package
// composes it into a statement of its own (idempotency.ClaimWrite writes an
// operation's effect and record in the statement that claims it); the
// rendering, with its parameter numbers and guard, is this package's, so no
// SQL crosses a package boundary.
type Insert struct {
	Table   string
	Columns []Column
}

// AppendGuarded appends the insert to sql as
//
//	INSERT INTO table (c1, ...) SELECT $first::type1, ... FROM rel WHERE rel.cond
//
// which writes the row only when the one row of relation rel has cond true;
// its parameters are numbered from first. It returns sql and the next free
// parameter number. rel and cond are identifiers of the caller's statement.
func (ins Insert) AppendGuarded(sql []byte, rel, cond string, first int) ([]byte, int) {
	sql, n := ins.appendSelect(sql, first)
	sql = append(sql, " FROM "...)
	sql = append(sql, rel...)
	sql = append(sql, " WHERE "...)
	sql = append(sql, rel...)
	sql = append(sql, '.')
	sql = append(sql, cond...)
	return sql, n
}

// Values returns the insert as a plain statement of its own:
//
//	INSERT INTO table (c1, ...) VALUES ($1::type1, ...)
func (ins Insert) Values() string {
	sql, _ := ins.appendColumns(nil, " VALUES (", 1)
	return string(append(sql, ')'))
}

func (ins Insert) appendSelect(sql []byte, first int) ([]byte, int) {
	return ins.appendColumns(sql, " SELECT ", first)
}

// appendColumns appends INSERT INTO table (names), then between, then the
// columns' parameters from first on.
func (ins Insert) appendColumns(sql []byte, between string, first int) ([]byte, int) {
	sql = append(sql, "INSERT INTO "...)
	sql = append(sql, ins.Table...)
	sql = append(sql, " ("...)
	for i, c := range ins.Columns {
		if i > 0 {
			sql = append(sql, ", "...)
		}
		sql = append(sql, c.Name...)
	}
	sql = append(sql, ')')
	sql = append(sql, between...)
	n := first
	for i, c := range ins.Columns {
		if i > 0 {
			sql = append(sql, ", "...)
		}
		if c.NullIfEmpty {
			sql = append(sql, "nullif("...)
		}
		sql = append(sql, '$')
		sql = strconv.AppendInt(sql, int64(n), 10)
		sql = append(sql, "::"...)
		sql = append(sql, c.Type...)
		if c.NullIfEmpty {
			sql = append(sql, ", '')"...)
		}
		n++
	}
	return sql, n
}

// Time passes t to pgx as a timestamptz in binary, as a time.Time goes, but
// without the wrapper pgx allocates around each time.Time it encodes: a
// create sends seven (issue 29).
func Time(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }
