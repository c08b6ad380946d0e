package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// directKey holds, in the CustomData of a direct connection whose
// statements pgx caches as prepared ones, the *directConn by which a
// transaction sent whole in one round trip goes to pgconn itself
// (Pipeline.Commit, decision 0106); a connection without it sends through
// pgx.Batch.
const directKey = "quill.direct"

// directConn is what a connection keeps for the transactions it sends
// itself: its statements' descriptions, its parameter buffers, and the
// pgx tracer of its configuration, read once at connect.
type directConn struct {
	described map[string]*pgconn.StatementDescription
	sds       []*pgconn.StatementDescription
	enc       argEncoder
	one       oneResult
	tracer    pgx.BatchTracer
	// wbuf is the buffer a trip's messages are encoded into (reserve).
	wbuf []byte
}

// markDirect gives c a directConn when its statements are cached prepared
// ones (QueryExecModeCacheStatement), whose descriptions stay valid for
// the session.
func markDirect(c *pgx.Conn) {
	cfg := c.Config()
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return
	}
	d := &directConn{described: make(map[string]*pgconn.StatementDescription)}
	d.tracer, _ = cfg.Tracer.(pgx.BatchTracer)
	c.PgConn().CustomData()[directKey] = d
}

// maxDirectStatements bounds the statements a connection prepares for
// itself, as pgx's statement cache is bounded (512 by default): Quill's
// statements are constants, but one built per call must not prepare a
// statement per call on the server.
const maxDirectStatements = 256

// takes reports whether b can go through d: every statement takes its
// arguments as they are — pgx reads a leading QueryExecMode, result
// formats or a QueryRewriter (named arguments) as options, which only
// pgx.Batch applies — and is described already or fits among the
// statements d may describe.
func (d *directConn) takes(b *pgx.Batch) bool {
	n := len(d.described)
	for _, q := range b.QueuedQueries {
		if len(q.Arguments) > 0 {
			switch q.Arguments[0].(type) {
			case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryRewriter:
				return false
			}
		}
		if _, ok := d.described[q.SQL]; !ok {
			if n++; n > maxDirectStatements {
				return false
			}
		}
	}
	return true
}

// sendDirect sends b's statements and one Sync in one round trip through
// pgconn's pipeline, as pgx's SendBatch and Close would in the cached
// statement mode — each bound to its prepared statement, its rows read by
// the kept description, each callback handed the statement's result — and
// returns what Close would: the first error of a statement, of a callback
// or of the connection. pgx's own path makes a builder's parameter buffer
// anew for every statement past 256 bytes and a result set per statement;
// a create's commit was 61 of its 177 µs against the floor's 50 for the
// same statements through pgx.Batch (issue 29).
//
// A statement not described on this connection yet is prepared first, in
// a round trip of its own that changes nothing.
func (d *directConn) sendDirect(ctx context.Context, c *pgx.Conn, b *pgx.Batch) (err error) {
	if d.tracer != nil {
		ctx = d.tracer.TraceBatchStart(ctx, c, pgx.TraceBatchStartData{Batch: b})
		defer func() { d.tracer.TraceBatchEnd(ctx, c, pgx.TraceBatchEndData{Err: err}) }()
	}
	d.sds = d.sds[:0]
	for _, q := range b.QueuedQueries {
		sd, ok := d.described[q.SQL]
		if !ok {
			if sd, err = c.Prepare(ctx, q.SQL, q.SQL); err != nil {
				return err
			}
			d.described[q.SQL] = sd
		}
		d.sds = append(d.sds, sd)
	}
	tm := c.TypeMap()
	d.enc.reset()
	for i, q := range b.QueuedQueries {
		if err := d.enc.add(tm, d.sds[i], q.Arguments); err != nil {
			return fmt.Errorf("encode arguments of statement %d: %w", i, err)
		}
	}
	pl := c.PgConn().StartPipeline(ctx)
	d.wbuf = reserve(c.PgConn().Frontend(), d.wbuf, tripBytes(&d.enc, d.sds))
	for i, sd := range d.sds {
		values, formats, results := d.enc.stmt(i)
		sendStmt(pl, sd, values, formats, results)
	}
	pl.SendPipelineSync()
	if err := pl.Flush(); err != nil {
		_ = pl.Close()
		return err
	}
	var first error
	// failed keeps err if it is the trip's first error and reports
	// whether the connection failed (rather than the server refusing a
	// statement, after which it skips to the Sync).
	failed := func(err error) bool {
		if first == nil {
			first = err
		}
		return !refusal(err)
	}
	one := &d.one
	one.tm = tm
	for i, q := range b.QueuedQueries {
		res, err := pl.GetResults()
		var tag pgconn.CommandTag
		if err == nil {
			rr, ok := res.(*pgconn.ResultReader)
			if !ok {
				_ = pl.Close()
				return fmt.Errorf("pipeline: statement %d answered %T", i, res)
			}
			one.rr = rr
			if q.Fn != nil {
				if e := q.Fn(one); e != nil && first == nil {
					first = e
				}
			}
			tag, err = rr.Close()
		}
		if d.tracer != nil {
			d.tracer.TraceBatchQuery(ctx, c, pgx.TraceBatchQueryData{SQL: q.SQL, Args: q.Arguments, CommandTag: tag, Err: err})
		}
		if err != nil {
			if failed(err) {
				_ = pl.Close()
				return first
			}
			break // pgconn skips the rest up to the Sync
		}
	}
	for {
		res, err := pl.GetResults()
		if err != nil {
			if failed(err) {
				_ = pl.Close()
				return first
			}
			continue
		}
		if _, ok := res.(*pgconn.PipelineSync); !ok {
			_ = pl.Close()
			return fmt.Errorf("pipeline: expected Sync, got %T", res)
		}
		break
	}
	if err := pl.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// tripBytes is a bound on the bytes of a trip's messages: each statement's
// Bind (its parameters, their lengths and formats, its result formats),
// Describe and Execute — and Parse, for an unnamed one — and the Sync.
func tripBytes(enc *argEncoder, sds []*pgconn.StatementDescription) int {
	n := len(enc.buf) + 2*len(enc.formats) + 2*len(enc.results) + 8
	for _, sd := range sds {
		n += 64 + 2*len(sd.Name) + 4*len(sd.ParamOIDs)
		if sd.Name == "" { // sent with its Parse (sendStmt)
			n += 16 + len(sd.SQL) + 4*len(sd.ParamOIDs)
		}
	}
	return n
}

// Bounds of the trips reserve arranges a buffer for: pgproto3's own stays
// within 1 KiB, and a trip larger than 64 KiB (an attachment's) is rare
// enough to grow pgproto3's buffer as before rather than to keep one of
// its size for each connection.
const (
	minReservedTrip = 1 << 10
	maxReservedTrip = 64 << 10
)

// reserve makes the write buffer of fe, a connection's frontend, hold n
// bytes more without growing, in buf (the connection's own, returned, made
// larger when it is short): pgproto3 encodes messages by appending them to
// its buffer, which its Flush replaces with a new one of 1 KiB once it held
// more, so that a create's trip of a few KiB grew a new buffer twice, 2.7
// of its µs in Bind.Encode against the floor's 1.5 (issue 29). buf is the
// frontend's until the Flush after the trip, which either replaces it (the
// trip held more than 1 KiB) or keeps it emptied, when the next reserve
// finds it as the frontend's buffer and keeps it there.
func reserve(fe *pgproto3.Frontend, buf []byte, n int) []byte {
	if n <= minReservedTrip || n > maxReservedTrip {
		return buf
	}
	if cap(buf) < n {
		buf = make([]byte, 0, n+n/4)
	}
	fe.Send(reservation{buf: buf, n: n})
	return buf
}

// reservation is the message by which reserve hands a frontend its buffer:
// it encodes to no bytes, and moves those pending into buf when the
// frontend's own has no room for n more. A Frontend that traces reports it
// as an Unknown message of length 0.
type reservation struct {
	buf []byte
	n   int
}

func (reservation) Frontend() {}

func (reservation) Decode([]byte) error { return errors.New("reservation: not a message to decode") }

func (r reservation) Encode(dst []byte) ([]byte, error) {
	if cap(dst)-len(dst) >= r.n || cap(r.buf) < len(dst)+r.n {
		return dst, nil
	}
	// dst may be buf itself, emptied: the copy is then of nothing.
	return append(r.buf[:0], dst...), nil
}
