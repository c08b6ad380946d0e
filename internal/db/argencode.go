package db

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// maxKeptArgBytes bounds the parameter bytes an argEncoder keeps between
// flushes: a flush of larger parameters (an attachment's) leaves its
// buffer to the collector rather than to the lane.
const maxKeptArgBytes = 256 << 10

// argEncoder encodes the parameters of a transaction's statements for
// pgconn as pgx's ExtendedQueryBuilder does — each parameter in the format
// its type prefers (text for a string), the other when that fails, NULL
// for nil; each result column in the format its type prefers — but into
// buffers it keeps from one flush to the next. An ExtendedQueryBuilder
// makes its parameter buffer anew whenever the last statement's outgrew
// 256 bytes, which a create's (its rendered note, record and event) always
// does: some 4 KB made and thrown away per create (issue 29).
// TestArgEncoderEncodesAsPgx holds it to ExtendedQueryBuilder.Build.
type argEncoder struct {
	buf     []byte
	values  [][]byte
	formats []int16
	results []int16
	// stmts are the ends, in values and results, of each statement's.
	stmts []encodedStmt
}

type encodedStmt struct{ values, results int }

// reset forgets every statement encoded, keeping the buffers.
func (e *argEncoder) reset() {
	if cap(e.buf) > maxKeptArgBytes {
		e.buf = nil
	}
	clear(e.values) // no bytes of an earlier flush are held through them
	e.buf, e.values, e.formats, e.results, e.stmts = e.buf[:0], e.values[:0], e.formats[:0], e.results[:0], e.stmts[:0]
}

// add encodes the parameters args of statement sd after those encoded
// since reset. On an error nothing of the statement stays.
func (e *argEncoder) add(m *pgtype.Map, sd *pgconn.StatementDescription, args []any) error {
	if len(sd.ParamOIDs) != len(args) {
		return fmt.Errorf("mismatched param and argument count")
	}
	buf, values, formats := e.buf, len(e.values), len(e.formats)
	for i, arg := range args {
		if err := e.param(m, sd.ParamOIDs[i], arg); err != nil {
			e.buf, e.values, e.formats = buf, e.values[:values], e.formats[:formats]
			return fmt.Errorf("failed to encode args[%d]: %w", i, err)
		}
	}
	for i := range sd.Fields {
		e.results = append(e.results, m.FormatCodeForOID(sd.Fields[i].DataTypeOID))
	}
	e.stmts = append(e.stmts, encodedStmt{values: len(e.values), results: len(e.results)})
	return nil
}

// param encodes arg as a parameter of type oid, in the format its type
// prefers or, when that fails, the other one.
func (e *argEncoder) param(m *pgtype.Map, oid uint32, arg any) error {
	format := m.FormatCodeForOID(oid)
	switch arg.(type) {
	case string, *string:
		format = pgx.TextFormatCode
	}
	err := e.encode(m, oid, format, arg)
	if err == nil {
		return nil
	}
	other := int16(pgx.TextFormatCode)
	if format == pgx.TextFormatCode {
		other = pgx.BinaryFormatCode
	}
	if e.encode(m, oid, other, arg) == nil {
		return nil
	}
	return err
}

func (e *argEncoder) encode(m *pgtype.Map, oid uint32, format int16, arg any) error {
	pos := len(e.buf)
	if e.buf == nil {
		e.buf = make([]byte, 0, 1024)
	}
	buf, err := m.Encode(oid, format, arg, e.buf)
	if err != nil {
		return err
	}
	var v []byte
	if buf != nil {
		e.buf = buf
		v = buf[pos:len(buf):len(buf)]
	}
	e.values = append(e.values, v)
	e.formats = append(e.formats, format)
	return nil
}

// stmt returns statement i's parameters, their formats and its result
// columns' formats, as added.
func (e *argEncoder) stmt(i int) (values [][]byte, formats, results []int16) {
	var from encodedStmt
	if i > 0 {
		from = e.stmts[i-1]
	}
	to := e.stmts[i]
	return e.values[from.values:to.values], e.formats[from.values:to.values], e.results[from.results:to.results]
}
