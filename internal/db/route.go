package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Route is how a connection string reaches PostgreSQL.
type Route int

const (
	// RouteDirect is PostgreSQL itself, or a plain TCP proxy in front of
	// it: the backend key the server sent at connect names the backend.
	RouteDirect Route = iota + 1
	// RouteSessionPooler is a pooler (its own backend key) that kept the
	// probe's client on one backend: PgBouncer's session mode.
	RouteSessionPooler
	// RouteTransactionPooler is a pooler that runs a client's transactions
	// on whichever backend is free: PgBouncer's transaction or statement
	// mode. Session state — advisory locks, LISTEN, prepared statements,
	// SET — does not outlive a transaction there.
	RouteTransactionPooler
)

func (r Route) String() string {
	switch r {
	case RouteDirect:
		return "direct"
	case RouteSessionPooler:
		return "session pooler"
	case RouteTransactionPooler:
		return "transaction pooler"
	}
	return fmt.Sprintf("Route(%d)", int(r))
}

// ErrTransactionPooler is returned by what needs a session of its own (the
// migrations' lock, the relay's claims and LISTEN) when its URL reaches a
// transaction pooler.
var ErrTransactionPooler = errors.New("reaches a transaction pooler (such as PgBouncer in transaction mode), which does not keep a session's advisory locks and LISTEN: point it at PostgreSQL directly or at a session pooler")

// probeTimeout bounds the probe's second statement: a pooler with every
// backend taken (a pool of one held by the probe's other client) makes it
// wait, which is as telling as an answer.
const probeTimeout = 2 * time.Second

// ProbeRoute tells how cc reaches PostgreSQL. Client A connects and
// compares the pid of its backend key with pg_backend_pid(): equal, the
// server itself answered (RouteDirect; a transaction pooler sends a key of
// its own, since its clients have no one backend). Otherwise client B opens
// a transaction (holding a backend) and reads its pid, and A reads its pid
// again: B on A's backend, A on another backend, or A kept waiting for one,
// is a transaction pooler; A on its own backend still is a session pooler.
// Every statement uses the simple protocol, so no prepared statement is
// left behind. It returns the connection's error, translated, when the
// server cannot be reached.
func ProbeRoute(ctx context.Context, cc *pgx.ConnConfig) (Route, error) {
	a, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", Translate(err))
	}
	defer a.Close(context.WithoutCancel(ctx))
	o := routeObservation{keyPID: a.PgConn().PID()}
	if o.pid, err = backendPID(ctx, a); err != nil {
		return 0, err
	}
	if o.keyPID == o.pid {
		return classify(o), nil
	}
	b, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", Translate(err))
	}
	defer b.Close(context.WithoutCancel(ctx))
	if _, err := b.Exec(ctx, "BEGIN"); err != nil {
		return 0, fmt.Errorf("begin: %w", Translate(err))
	}
	if o.otherPID, err = backendPID(ctx, b); err != nil {
		return 0, err
	}
	actx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	o.againPID, err = backendPID(actx, a)
	switch {
	case err != nil && ctx.Err() == nil && actx.Err() != nil:
		o.blocked = true
	case err != nil:
		return 0, err
	}
	return classify(o), nil
}

// routeObservation is what ProbeRoute saw.
type routeObservation struct {
	keyPID   uint32 // the pid of client A's backend key
	pid      uint32 // pg_backend_pid() on A
	otherPID uint32 // pg_backend_pid() in client B's open transaction
	againPID uint32 // pg_backend_pid() on A again, B's transaction open
	blocked  bool   // A's second statement found no backend in time
}

// classify is ProbeRoute's decision.
func classify(o routeObservation) Route {
	switch {
	case o.keyPID == o.pid:
		return RouteDirect
	case o.blocked, o.otherPID == o.pid, o.againPID != o.pid:
		return RouteTransactionPooler
	}
	return RouteSessionPooler
}

func backendPID(ctx context.Context, c *pgx.Conn) (uint32, error) {
	var pid uint32
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return 0, fmt.Errorf("read backend pid: %w", Translate(err))
	}
	return pid, nil
}
