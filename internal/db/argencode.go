package db

import (
	"fmt"
	"reflect"

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
	// plans are what encoding each described statement's parameters
	// found in pgx's type map — each parameter's encode plan for the
	// type of argument it was last given, and the result columns'
	// formats — by description: pgx looks each up in maps for every
	// parameter of every statement, 2 µs of a create's CPU (issue 29).
	plans map[*pgconn.StatementDescription]*stmtPlans
}

// stmtPlans are a statement's parameters' plans and its result formats.
type stmtPlans struct {
	params  []paramPlan
	results []int16
}

// paramPlan is the plan by which a parameter's last argument of type typ
// was encoded in format, the first format tried for it; nil typ: none.
type paramPlan struct {
	typ    reflect.Type
	format int16
	plan   pgtype.EncodePlan
}

// maxPlans bounds the descriptions an argEncoder keeps plans for: a write
// group's lane encodes for every connection it is handed, and connections
// come and go.
const maxPlans = 512

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
	sp := e.plansOf(m, sd)
	buf, values, formats := e.buf, len(e.values), len(e.formats)
	for i, arg := range args {
		if err := e.param(m, sd.ParamOIDs[i], arg, &sp.params[i]); err != nil {
			e.buf, e.values, e.formats = buf, e.values[:values], e.formats[:formats]
			return fmt.Errorf("failed to encode args[%d]: %w", i, err)
		}
	}
	e.results = append(e.results, sp.results...)
	e.stmts = append(e.stmts, encodedStmt{values: len(e.values), results: len(e.results)})
	return nil
}

// plansOf returns sd's plans, made (its result formats found) the first
// time.
func (e *argEncoder) plansOf(m *pgtype.Map, sd *pgconn.StatementDescription) *stmtPlans {
	if sp, ok := e.plans[sd]; ok {
		return sp
	}
	if e.plans == nil || len(e.plans) >= maxPlans {
		e.plans = make(map[*pgconn.StatementDescription]*stmtPlans)
	}
	sp := &stmtPlans{params: make([]paramPlan, len(sd.ParamOIDs)), results: make([]int16, len(sd.Fields))}
	for i := range sd.Fields {
		sp.results[i] = m.FormatCodeForOID(sd.Fields[i].DataTypeOID)
	}
	e.plans[sd] = sp
	return sp
}

// param encodes arg as a parameter of type oid, in the format its type
// prefers or, when that fails, the other one — by pp's plan when arg is of
// the type pp was made for and not a nil, which pgx's Map.Encode would
// answer before any plan. A plan that fails leaves the argument to the
// whole of pgx's path, which words the error or tries the other format.
func (e *argEncoder) param(m *pgtype.Map, oid uint32, arg any, pp *paramPlan) error {
	var typ reflect.Type
	if arg != nil {
		typ = reflect.TypeOf(arg)
		if typ == pp.typ && !isNil(arg, typ) {
			pos := len(e.buf)
			if e.buf == nil {
				e.buf = make([]byte, 0, 1024)
			}
			if buf, err := pp.plan.Encode(arg, e.buf); err == nil {
				e.push(buf, pos, pp.format)
				return nil
			}
		}
	}
	format := m.FormatCodeForOID(oid)
	switch arg.(type) {
	case string, *string:
		format = pgx.TextFormatCode
	}
	err := e.encode(m, oid, format, arg)
	if err == nil {
		if typ != nil && !isNil(arg, typ) {
			if plan := m.PlanEncode(oid, format, arg); plan != nil {
				*pp = paramPlan{typ: typ, format: format, plan: plan}
			}
		}
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

// isNil reports whether arg, of type typ, is a nil pointer, slice, map,
// channel, function or interface: pgx's Map.Encode sends those as NULL
// (or asks their driver.Valuer) without a plan.
func isNil(arg any, typ reflect.Type) bool {
	switch typ.Kind() {
	case reflect.Chan, reflect.Func, reflect.Map, reflect.Pointer, reflect.UnsafePointer, reflect.Interface, reflect.Slice:
		return reflect.ValueOf(arg).IsNil()
	}
	return false
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
	e.push(buf, pos, format)
	return nil
}

// push records the parameter encoded into buf from pos in format (nil buf:
// NULL).
func (e *argEncoder) push(buf []byte, pos int, format int16) {
	var v []byte
	if buf != nil {
		e.buf = buf
		v = buf[pos:len(buf):len(buf)]
	}
	e.values = append(e.values, v)
	e.formats = append(e.formats, format)
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
