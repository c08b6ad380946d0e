// Package db opens Quill's PostgreSQL pool, applies the embedded migrations,
// runs transactions — WithTx, and Pipeline for a transaction sent in as few
// round trips as possible, with Recheck for one whose COMMIT reply was lost —
// and translates driver errors into Quill's own once, at the boundary.
package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is the database used when DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/quill?sslmode=disable"

// idleInTxTimeout is the idle_in_transaction_session_timeout of Quill's
// sessions when the operator set none; no Quill transaction waits on its
// client that long. A session whose client vanished mid-transaction (a
// partition the server has not noticed) would hold its operation's lock,
// and every retry would answer 409; the server ends such sessions itself.
const idleInTxTimeout = "60s"

// StatementTimeout is the statement_timeout of Quill's sessions when the
// operator set none (in the URL, or on the role or database): longer than
// any statement of Quill's takes, and shorter than QUILL_WRITE_TIMEOUT, so
// that a runaway statement is ended by the server while its request can
// still be answered, instead of holding a connection and its locks for as
// long as it runs (decision 0070). Migrations run without one.
const StatementTimeout = "30s"

// sqlSessionSettings applies idleInTxTimeout and StatementTimeout to the
// transaction it runs in (set_config's true: transaction-local), each
// unless the session has one already (the startup parameter of a direct
// connection, or the server's, database's or role's setting). Behind a
// pooler, which refuses the startup parameters and would hand a
// session-level SET to the next client, it is how the protections hold. It
// also returns the backend's pid, which behind a pooler differs from the
// connection's backend key, and the transaction's start (now()), which
// tells this transaction from a later one of another client on the same
// backend (see Recheck).
const sqlSessionSettings = `SELECT pg_backend_pid(), now(), CASE WHEN current_setting('idle_in_transaction_session_timeout') = '0'
	THEN set_config('idle_in_transaction_session_timeout', '` + idleInTxTimeout + `', true) END,
	CASE WHEN current_setting('statement_timeout') = '0' THEN set_config('statement_timeout', '` + StatementTimeout + `', true) END`

// isolationParam and readCommitted are the startup parameter, and its
// value, that make READ COMMITTED a direct session's default.
const (
	isolationParam = "default_transaction_isolation"
	readCommitted  = "read committed"
)

// implicitKey marks, in a direct connection's CustomData, a session whose
// default isolation is READ COMMITTED, so that a transaction sent whole in
// one round trip may be an implicit one (Pipeline.Commit). Behind a pooler
// no startup parameter reaches the session, and BEGIN names the level.
const implicitKey = "quill.implicit_tx"

// pooledKey marks, in a connection's CustomData, a connection that reaches
// PostgreSQL through a pooler: its transactions apply sqlSessionSettings.
const pooledKey = "quill.pooled"

// typedKey marks, in a connection's CustomData, a connection whose query
// mode describes statements, so that a transaction's parameters may be
// kept in its Args (Args.typed). It is read per transaction, where
// pgx.Conn.Config would copy the whole configuration (issue 29); a
// connection without it (a pool not made by Open) boxes plain values.
const typedKey = "quill.typed_args"

// beginReadCommitted and beginSnapshot begin WithTx's and WithSnapshot's
// transactions with the session settings, in the one simple-protocol round
// trip of BEGIN (on a direct connection the settings are a no-op).
const (
	beginReadCommitted = sqlBegin + "; " + sqlSessionSettings
	beginSnapshot      = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; " + sqlSessionSettings
)

// transactionPoolerMode is the query mode of a pool whose URL reaches a
// transaction pooler and names none (default_query_exec_mode): statements
// are parsed unnamed in the round trip that runs them, only their
// descriptions are cached, so none has to outlive its transaction's
// backend.
const transactionPoolerMode = pgx.QueryExecModeCacheDescribe

// rollbackTimeout bounds a rollback that runs after the caller's context ended.
const rollbackTimeout = 5 * time.Second

// ErrNotFound is returned when a query that must find one row finds none.
var ErrNotFound = errors.New("not found")

// ErrUnavailable marks an error caused by the database being unreachable or
// going away; callers answer "try again" rather than "you are wrong".
var ErrUnavailable = errors.New("database unavailable")

// ErrConflict marks a unique-violation, serialization failure or deadlock:
// another transaction won a race.
var ErrConflict = errors.New("conflict with a concurrent transaction")

// ErrDuplicate marks a unique violation: a concurrent transaction inserted
// the same key first. It is also an ErrConflict.
var ErrDuplicate = fmt.Errorf("%w: duplicate key", ErrConflict)

// ErrLockTimeout marks a statement that waited longer than the
// transaction's lock_timeout for a lock another transaction holds
// (lock_not_available). It is also an ErrUnavailable: the transaction was
// rolled back, nothing was committed, and the same request may succeed once
// the lock is released.
var ErrLockTimeout = fmt.Errorf("%w: lock timeout", ErrUnavailable)

// ErrPoolTimeout marks a request that found no free connection in the
// pool within its acquire timeout. It is also an ErrUnavailable: nothing
// was sent to the database.
var ErrPoolTimeout = fmt.Errorf("%w: no free connection in the pool", ErrUnavailable)

// Open connects a pool to url and verifies the connection. It probes the
// route first (ProbeRoute). A direct connection gets Quill's
// idle_in_transaction_session_timeout as a startup parameter (unless url
// sets one), StatementTimeout for its session right after connecting
// (unless url, the role or the database sets one), and pgx's default query
// mode, which caches prepared statements per connection. Behind a pooler —
// which refuses startup parameters — the settings are applied per
// transaction instead (WithTx, Pipeline), and to the whole session behind
// a session pooler; behind a transaction pooler a statement run outside a
// transaction has the role's or database's statement_timeout (the runtime
// role of docs/operations.md sets one). A transaction pooler gets
// transactionPoolerMode, whose statements need no prepared statement to
// outlive their transaction. A query mode named in url (pgx's
// default_query_exec_mode parameter) always wins. maxConns is the pool's
// size unless url names pgxpool's pool_max_conns, which wins too, so that
// an operator sizes a pool in its URL. It returns an error
// wrapping ErrUnavailable when the server cannot be reached.
func Open(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	named, err := namedParams(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	_, explicitMode := named["default_query_exec_mode"]
	if _, ok := named["pool_max_conns"]; maxConns > 0 && !ok {
		cfg.MaxConns = maxConns
	}
	cc := cfg.ConnConfig
	unreachable := func(err error) error {
		return fmt.Errorf("connect to %s:%d/%s: %w", cc.Host, cc.Port, cc.Database, Translate(err))
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	route, err := ProbeRoute(pingCtx, cc)
	if err != nil {
		return nil, unreachable(err)
	}
	// The session's statement_timeout is set after connecting, not as a
	// startup parameter, so that the role's or database's own value is
	// kept; one named in url is a startup parameter and is kept too.
	_, timeoutNamed := cc.RuntimeParams["statement_timeout"]
	switch route {
	case RouteDirect:
		if _, ok := cc.RuntimeParams["idle_in_transaction_session_timeout"]; !ok {
			cc.RuntimeParams["idle_in_transaction_session_timeout"] = idleInTxTimeout
		}
		// READ COMMITTED is the session's default, so that a pipelined
		// transaction sent in one round trip can go without BEGIN and
		// COMMIT (Pipeline.Commit); a URL that names another default
		// keeps them.
		iso, isoNamed := cc.RuntimeParams[isolationParam]
		if !isoNamed {
			cc.RuntimeParams[isolationParam] = readCommitted
		}
		implicit := !isoNamed || strings.EqualFold(strings.TrimSpace(iso), readCommitted)
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			c.PgConn().CustomData()[implicitKey] = implicit
			markTyped(c)
			markDirect(c)
			return startSession(ctx, c, !timeoutNamed)
		}
	default:
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			c.PgConn().CustomData()[pooledKey] = true
			markTyped(c)
			if route == RouteSessionPooler && !timeoutNamed {
				// The session is this client's until it ends, and the
				// pooler resets it then (server_reset_query).
				if _, err := c.Exec(ctx, sqlSessionStatementTimeout, pgx.QueryExecModeSimpleProtocol); err != nil {
					return fmt.Errorf("session settings: %w", Translate(err))
				}
			}
			return nil
		}
		if route == RouteTransactionPooler && !explicitMode {
			cc.DefaultQueryExecMode = transactionPoolerMode
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, unreachable(err)
	}
	return pool, nil
}

// sessionStartKey holds, in a direct connection's CustomData, the
// database's clock read right after the session began: Recheck compares it
// with pg_stat_activity.backend_start, so both times come from the one
// server's clock, whatever the API host's clock says.
const sessionStartKey = "quill.session_start"

// sqlSessionStart reads the database's clock; in a statement of its own,
// now() is the time the statement started. sqlSessionStartWithTimeout
// also gives the session StatementTimeout unless the role or database gave
// it one, as sqlSessionStatementTimeout does alone.
const (
	sqlSessionStart            = `SELECT now()`
	sqlSessionStatementTimeout = `SELECT CASE WHEN current_setting('statement_timeout') = '0'
	THEN set_config('statement_timeout', '` + StatementTimeout + `', false) END`
	sqlSessionStartWithTimeout = `SELECT now(), (` + sqlSessionStatementTimeout + `)`
)

// startSession stores the database's clock at the session's start under
// sessionStartKey and, with timeout, applies StatementTimeout to the
// session: one round trip per new connection.
func startSession(ctx context.Context, c *pgx.Conn, timeout bool) error {
	var t time.Time
	var err error
	if timeout {
		var discard any
		err = c.QueryRow(ctx, sqlSessionStartWithTimeout, pgx.QueryExecModeSimpleProtocol).Scan(&t, &discard)
	} else {
		err = c.QueryRow(ctx, sqlSessionStart, pgx.QueryExecModeSimpleProtocol).Scan(&t)
	}
	if err != nil {
		return fmt.Errorf("read the session's start: %w", Translate(err))
	}
	c.PgConn().CustomData()[sessionStartKey] = t
	return nil
}

// sessionStart returns a time, on the database's clock, at or after the
// session of conn began (see sessionStartKey). A connection of a pool that
// Open did not build has none; then the host's clock stands in, as good as
// the two clocks agree.
func sessionStart(conn *pgxpool.Conn) time.Time {
	if t, ok := conn.Conn().PgConn().CustomData()[sessionStartKey].(time.Time); ok {
		return t
	}
	return time.Now()
}

// namedParams returns the parameters url names beyond pgconn's own, such
// as default_query_exec_mode and pool_max_conns (pgx takes them out of the
// parsed runtime parameters; pgconn keeps them).
func namedParams(url string) (map[string]string, error) {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	return pc.RuntimeParams, nil
}

// AsOf returns t as a statement's parameter, NULL for the zero time, for
// SQL that compares with coalesce($n, now()): the zero time stands for the
// database's clock, which every process reads alike whatever its host's
// clock says.
func AsOf(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// Beginner is what WithTx needs: a pool or a connection.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// WithTx runs fn in a READ COMMITTED transaction (whatever the session's
// default), with Quill's session settings, and commits it when fn returns
// nil. The
// rollback after a failure runs even when ctx is already cancelled, so a
// cancelled caller never leaves a transaction open. Errors are translated.
func WithTx(ctx context.Context, b Beginner, fn func(pgx.Tx) error) error {
	tx, err := b.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", Translate(err))
	}
	if err := fn(tx); err != nil {
		Rollback(ctx, tx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", Translate(err))
	}
	return nil
}

// WithSnapshot runs fn in a READ ONLY, REPEATABLE READ transaction — one
// snapshot for every statement, as a report that reads many tables needs —
// and rolls it back afterwards, even when ctx is already cancelled. It
// returns fn's error, or the translated error of BEGIN.
func WithSnapshot(ctx context.Context, b Beginner, fn func(pgx.Tx) error) error {
	tx, err := b.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSnapshot})
	if err != nil {
		return fmt.Errorf("begin: %w", Translate(err))
	}
	defer Rollback(ctx, tx)
	return fn(tx)
}

// Rollback rolls tx back on a context that survives the caller's
// cancellation; the error is dropped because the transaction is abandoned
// either way (a broken connection is discarded by the pool).
func Rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// Affected returns how many rows the statement that answered tag and err
// affected, or err wrapped with what the statement did.
func Affected(what string, tag pgconn.CommandTag, err error) (int64, error) {
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return tag.RowsAffected(), nil
}

// Translate maps driver errors to Quill's sentinel errors, keeping the
// original in the chain: pgx.ErrNoRows → ErrNotFound; a unique violation →
// ErrDuplicate (also an ErrConflict); a serialization failure or deadlock →
// ErrConflict; lock_not_available (lock_timeout) → ErrLockTimeout; network
// errors, admin shutdown and connection failures → ErrUnavailable. An error
// already translated, and any other error, is returned unchanged.
func Translate(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
		return err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.UniqueViolation:
			return fmt.Errorf("%w: %w", ErrDuplicate, err)
		case pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected:
			return fmt.Errorf("%w: %w", ErrConflict, err)
		case pgerrcode.LockNotAvailable:
			return fmt.Errorf("%w: %w", ErrLockTimeout, err)
		case pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
			pgerrcode.TooManyConnections,
			pgerrcode.ConnectionException, pgerrcode.ConnectionDoesNotExist, pgerrcode.ConnectionFailure,
			pgerrcode.SQLClientUnableToEstablishSQLConnection, pgerrcode.SQLServerRejectedEstablishmentOfSQLConnection:
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	if IsConnectionError(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// IsConnectionError reports whether err came from the connection rather than
// from the server's answer to a statement: dial failures, broken sockets,
// timeouts, a closed connection.
func IsConnectionError(err error) bool {
	var (
		connErr *pgconn.ConnectError
		netErr  net.Error
		pgErr   *pgconn.PgError
	)
	switch {
	case errors.As(err, &connErr), errors.As(err, &netErr):
		return true
	case pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	case errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNREFUSED):
		// What pgconn returns, wrapped, for a socket that died: the read's
		// EOF, the write's broken pipe, or its own "conn closed" after it
		// closed the connection on an earlier failure.
		return true
	case errors.As(err, &pgErr):
		return false
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// sessionEnded reports whether the server ended the session (admin
// shutdown, crash, connection failure): then it is unknown which statements
// of a pipeline, COMMIT included, ran before it did.
func sessionEnded(e *pgconn.PgError) bool {
	if e.Severity == "FATAL" || e.Severity == "PANIC" || pgerrcode.IsConnectionException(e.Code) {
		return true
	}
	switch e.Code {
	case pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
		pgerrcode.DatabaseDropped, pgerrcode.IdleSessionTimeout:
		return true
	}
	return false
}
