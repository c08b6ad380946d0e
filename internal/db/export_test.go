package db

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// SessionStartOf exposes, to the external tests, the time a pipeline's
// recheck compares with backend_start.
func SessionStartOf(p *Pipeline) time.Time { return p.since }

// ArgEncoder exposes argEncoder to the external tests.
type ArgEncoder struct{ e argEncoder }

func (a *ArgEncoder) Reset() { a.e.reset() }

func (a *ArgEncoder) Add(m *pgtype.Map, sd *pgconn.StatementDescription, args []any) error {
	return a.e.add(m, sd, args)
}

func (a *ArgEncoder) Stmt(i int) (values [][]byte, formats, results []int16) { return a.e.stmt(i) }

// DirectStatements is how many statements p's connection has described
// for sending transactions itself, or -1 when it sends through pgx.Batch.
func DirectStatements(p *Pipeline) int {
	if p.direct == nil {
		return -1
	}
	return len(p.direct.described)
}

// MaxDirectStatements exposes maxDirectStatements to the external tests.
const MaxDirectStatements = maxDirectStatements

// SendDirect sends b through c's directConn (made when c has none) and
// returns, besides sendDirect's error, the bound tripBytes gave the trip
// and the buffer the connection keeps for its trips.
func SendDirect(ctx context.Context, c *pgx.Conn, b *pgx.Batch) (bound int, wbuf []byte, err error) {
	d, _ := c.PgConn().CustomData()[directKey].(*directConn)
	if d == nil {
		markDirect(c)
		d = c.PgConn().CustomData()[directKey].(*directConn)
	}
	err = d.sendDirect(ctx, c, b)
	return tripBytes(&d.enc, d.sds), d.wbuf, err
}
