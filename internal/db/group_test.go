package db_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

type groupBundle struct {
	pool *pgxpool.Pool
	g    *db.Group
	// locks is where the tests hold their advisory locks: a direct pool,
	// whose session keeps them (pool, unless pool goes through a pooler).
	locks *pgxpool.Pool
}

// setupGroup opens a pool on a fresh schema with a table t (id text
// primary key, v int) and a group on it, closed when t ends.
func setupGroup(t *testing.T, url string, cfg db.GroupConfig) *groupBundle {
	t.Helper()
	ctx := t.Context()
	pool, err := db.Open(ctx, url, 8)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS t (id text PRIMARY KEY, v int NOT NULL DEFAULT 0)")
	require.NoError(t, err)
	g, err := db.NewGroup(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(g.Close)
	return &groupBundle{pool: pool, g: g, locks: pool}
}

func insertTx(id string) *db.GroupTx {
	return &db.GroupTx{Stmts: []db.GroupStmt{{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{id}}}}
}

// ids returns the ids of t's rows, sorted.
func (b *groupBundle) ids(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(t.Context(), "SELECT id FROM t ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// holdLock takes an advisory lock of its own on a connection of its own
// and returns its key and the function that releases it.
func holdLock(t *testing.T, pool *pgxpool.Pool) (int64, func()) {
	t.Helper()
	key := rand.Int64N(1 << 31) // pg_locks shows it as objid, classid 0
	conn, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), "SELECT pg_advisory_lock($1)", key)
	require.NoError(t, err)
	var once sync.Once
	release := func() {
		once.Do(func() {
			_, err := conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", key)
			require.NoError(t, err)
			conn.Release()
		})
	}
	t.Cleanup(release)
	return key, release
}

func lockTx(key int64) *db.GroupTx {
	return &db.GroupTx{Stmts: []db.GroupStmt{{SQL: "SELECT pg_advisory_xact_lock($1)", Args: []any{key}}}}
}

// async runs Do in a goroutine of its own; its result arrives on the
// returned channel.
func async(ctx context.Context, g *db.Group, tx *db.GroupTx) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- g.Do(ctx, tx) }()
	return ch
}

// oneFlush sends txs in one flush of a one-lane group: a first
// transaction waits for an advisory lock the test holds, which keeps the
// lane busy while txs are queued one by one, in order; the lock's release
// lets the lane take them all at once; during, when set, runs then. It
// returns each Do's result.
func (b *groupBundle) oneFlush(t *testing.T, during func(), txs ...*db.GroupTx) []error {
	t.Helper()
	ctx := t.Context()
	key, release := holdLock(t, b.locks)
	before := b.g.Stats()
	blocker := async(ctx, b.g, lockTx(key))
	require.Eventually(t, func() bool { return b.g.Stats().Flushes == before.Flushes+1 }, 10*time.Second, time.Millisecond)
	chans := make([]<-chan error, len(txs))
	for i, tx := range txs {
		chans[i] = async(ctx, b.g, tx)
		require.Eventually(t, func() bool { return b.g.Stats().Queued == i+1 }, 10*time.Second, time.Millisecond)
	}
	release()
	if during != nil {
		during()
	}
	require.NoError(t, <-blocker)
	errs := make([]error, len(txs))
	for i, ch := range chans {
		errs[i] = <-ch
	}
	after := b.g.Stats()
	require.Equal(t, before.Flushes+2, after.Flushes, "the blocker's flush and one more")
	return errs
}

// Concurrent callers share flushes: more transactions than writes, and
// every one committed.
func TestGroupCoalesces(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 2})
	const callers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, callers*each)
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				errs <- b.g.Do(t.Context(), insertTx(string(rune('a'+c))+"-"+string(rune('a'+i))))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := b.g.Stats()
	require.Equal(t, uint64(callers*each), st.Txs)
	require.Equal(t, uint64(callers*each), st.Committed)
	require.Less(t, st.Flushes, st.Txs, "some flushes carried several transactions: %+v", st)
	require.Greater(t, st.MaxBatch, 1)
	require.Len(t, b.ids(t), callers*each)
}

// A lone caller is never made to linger, however long MaxDelay: each of
// its transactions is a flush of its own. Under concurrency the same
// setting does linger, so the count can tell.
func TestGroupLoneCallerNotDelayed(t *testing.T) {
	t.Parallel()
	u := dbtest.Schema(t)
	lone := setupGroup(t, u, db.GroupConfig{Lanes: 2, MaxDelay: time.Hour})
	for i := range 20 {
		require.NoError(t, lone.g.Do(t.Context(), insertTx(string(rune('a'+i)))))
	}
	st := lone.g.Stats()
	require.Equal(t, uint64(20), st.Flushes)
	require.Zero(t, st.Lingered)

	busy := setupGroup(t, u, db.GroupConfig{Lanes: 2, MaxDelay: 2 * time.Millisecond})
	var wg sync.WaitGroup
	for c := range 16 {
		wg.Go(func() {
			for i := range 10 {
				require.NoError(t, busy.g.Do(t.Context(), insertTx("busy-"+string(rune('a'+c))+string(rune('a'+i)))))
			}
		})
	}
	wg.Wait()
	require.NotZero(t, busy.g.Stats().Lingered)
}

// A transaction the server refuses in the middle of a write is rolled back
// alone: the ones before and after it in the same write commit, and the
// results read after it belong to the right statements.
func TestGroupRefusedTransactionAlone(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1})
	_, err := b.pool.Exec(t.Context(), "INSERT INTO t (id, v) VALUES ('taken', 1)")
	require.NoError(t, err)
	var before, after int
	errs := b.oneFlush(t, nil,
		&db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "INSERT INTO t (id, v) VALUES ($1, 2) RETURNING v", Args: []any{"k-1"}, Row: func(r pgx.Row) error { return r.Scan(&before) }},
		}},
		&db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"k"}},
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"taken"}},
			{SQL: "INSERT INTO t (id) VALUES ($1) RETURNING v", Args: []any{"k-after"}, Row: func(r pgx.Row) error { return r.Scan(new(int)) }},
		}},
		&db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "UPDATE t SET v = v + 1 WHERE id = $1 RETURNING v", Args: []any{"taken"}, Row: func(r pgx.Row) error { return r.Scan(&after) }},
			{SQL: "INSERT INTO t (id, v) VALUES ($1, 3)", Args: []any{"k+1"}},
		}},
	)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], db.ErrDuplicate)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, errs[1], &pgErr)
	require.NoError(t, errs[2])
	require.Equal(t, 2, before)
	require.Equal(t, 2, after)
	require.Equal(t, []string{"k+1", "k-1", "taken"}, b.ids(t))
	st := b.g.Stats()
	require.Equal(t, uint64(1), st.Refused)
	require.Equal(t, 3, st.MaxBatch, "the three went in one write")
}

// A transaction whose arguments do not encode, or whose statement the
// server cannot prepare, is refused before anything of it is written; the
// others of the same write commit.
func TestGroupUnsendableTransactionAlone(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1})
	errs := b.oneFlush(t, nil,
		insertTx("before"),
		&db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"mismatched"}},
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"one", "too many"}},
		}},
		&db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"unprepared"}},
			{SQL: "INSERT INTO no_such_table (id) VALUES ($1)", Args: []any{"x"}},
		}},
		insertTx("after"),
	)
	require.NoError(t, errs[0])
	require.ErrorContains(t, errs[1], "encode arguments of statement 1")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, errs[2], &pgErr)
	require.Equal(t, "42P01", pgErr.Code)
	require.NoError(t, errs[3])
	require.Equal(t, []string{"after", "before"}, b.ids(t))
	st := b.g.Stats()
	require.Equal(t, uint64(3), st.Txs, "the blocker, before and after were written")
	require.Equal(t, 2, st.MaxBatch)
}

// A transaction's lock timeout holds for it alone, also next to a
// transaction that failed on it, in the same write.
func TestGroupLockTimeoutIsLocal(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1})
	key, _ := holdLock(t, b.pool)
	setting := func(lock time.Duration, got *string) *db.GroupTx {
		return &db.GroupTx{LockTimeout: lock, Stmts: []db.GroupStmt{
			{SQL: "SELECT current_setting('lock_timeout')", Row: func(r pgx.Row) error { return r.Scan(got) }},
		}}
	}
	var first, second, fourth string
	timedOut := lockTx(key)
	timedOut.LockTimeout = 50 * time.Millisecond
	errs := b.oneFlush(t, nil,
		setting(250*time.Millisecond, &first),
		setting(0, &second),
		timedOut,
		setting(0, &fourth),
	)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[2], db.ErrLockTimeout)
	require.NoError(t, errs[3])
	require.Equal(t, "250ms", first)
	require.Equal(t, "0", second)
	require.Equal(t, "0", fourth)
}

// A session whose default isolation is another still runs the group's
// transactions READ COMMITTED.
func TestGroupReadCommitted(t *testing.T) {
	t.Parallel()
	u := dbtest.WithParam(t, dbtest.Schema(t), "default_transaction_isolation", "serializable")
	b := setupGroup(t, u, db.GroupConfig{Lanes: 1})
	var session, tx string
	require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT current_setting('transaction_isolation')").Scan(&session))
	require.Equal(t, "serializable", session, "the URL's default reaches the session")
	for range 3 {
		require.NoError(t, b.g.Do(t.Context(), &db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "SELECT current_setting('transaction_isolation')", Row: func(r pgx.Row) error { return r.Scan(&tx) }},
		}}))
		require.Equal(t, "read committed", tx)
	}
}

// A pgx.Batch's statements and callbacks go through the group unchanged.
func TestGroupTxFromBatch(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{})
	var batch pgx.Batch
	var v int
	var tag pgconn.CommandTag
	var ids []string
	batch.Queue("INSERT INTO t (id, v) VALUES ($1, $2) RETURNING v", "b1", 7).QueryRow(func(r pgx.Row) error { return r.Scan(&v) })
	batch.Queue("INSERT INTO t (id) VALUES ($1), ($2)", "b2", "b3").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	batch.Queue("SELECT id FROM t ORDER BY id").Query(func(rows pgx.Rows) error {
		var err error
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	batch.Queue("SELECT 1")
	require.NoError(t, b.g.Do(t.Context(), db.GroupTxFromBatch(&batch)))
	require.Equal(t, 7, v)
	require.Equal(t, int64(2), tag.RowsAffected())
	require.Equal(t, []string{"b1", "b2", "b3"}, ids)

	// A callback's error after the commit says so.
	err := b.g.Do(t.Context(), &db.GroupTx{Stmts: []db.GroupStmt{
		{SQL: "INSERT INTO t (id) VALUES ('b4') RETURNING v", Row: func(r pgx.Row) error { return errors.New("scanner broke") }},
	}})
	require.ErrorIs(t, err, db.ErrReadAfterCommit)
	require.Contains(t, b.ids(t), "b4")
}

// When the lane's backend is terminated mid-write, the transactions whose
// outcome was not read are unknown — named by the backend's pid and the
// session's start, for Recheck — the one read before is committed (unless
// its answer waited for a commit barrier that never came), and the group
// goes on serving on another connection.
func TestGroupBackendTerminated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		barrier, shared bool
	}{{"one flush per commit", false, false}, {"commit barrier", true, false}, {"shared commit", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A schema each: their setups' CREATE TABLE would race.
			testGroupBackendTerminated(t, dbtest.Schema(t), tc.barrier, tc.shared)
		})
	}
}

func testGroupBackendTerminated(t *testing.T, u string, barrier, shared bool) {
	b := setupGroup(t, u, db.GroupConfig{Lanes: 1, CommitBarrier: barrier, SharedCommit: shared})
	ctx := t.Context()
	first, after := "first", "after"
	switch {
	case barrier:
		first, after = "first-b", "after-b"
	case shared:
		first, after = "first-s", "after-s"
	}
	key, _ := holdLock(t, b.pool)
	var pid uint32
	terminate := func() {
		require.Eventually(t, func() bool {
			err := b.pool.QueryRow(ctx, `SELECT pid FROM pg_locks
				WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid::bigint = $1`, key).Scan(&pid)
			return err == nil
		}, 10*time.Second, 5*time.Millisecond)
		var ended bool
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ended))
		require.True(t, ended)
	}
	errs := b.oneFlush(t, terminate, insertTx(first), lockTx(key), insertTx("third"))
	unknown := errs[1:]
	if barrier || shared {
		// One commit for the whole flush (shared), or a barrier for it:
		// none of the three is known.
		unknown = errs
	} else {
		require.NoError(t, errs[0])
	}
	for _, err := range unknown {
		var lost *db.OutcomeUnknownError
		require.ErrorAs(t, err, &lost)
		require.ErrorIs(t, err, db.ErrUnavailable)
		require.Equal(t, pid, lost.PID)
		require.False(t, lost.SessionStart.IsZero())
	}
	require.Equal(t, uint64(len(unknown)), b.g.Stats().Unknown)
	require.NoError(t, b.g.Do(ctx, insertTx(after)))
	ids := b.ids(t)
	if shared {
		require.NotContains(t, ids, first, "its commit was the flush's, which never came")
	} else {
		require.Contains(t, ids, first, "committed before the backend ended")
	}
	require.Contains(t, ids, after)
	require.NotContains(t, ids, "third")
}

// With CommitBarrier a flush of several transactions commits each without
// waiting for its WAL flush and ends with one barrier that does; a flush
// of one commits as usual. Refusals stay each transaction's own.
func TestGroupCommitBarrier(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1, CommitBarrier: true})
	syncCommit := func(id string, got *string) *db.GroupTx {
		return &db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{id}},
			{SQL: "SELECT current_setting('synchronous_commit')", Row: func(r pgx.Row) error { return r.Scan(got) }},
		}}
	}
	var lone string
	require.NoError(t, b.g.Do(t.Context(), syncCommit("lone", &lone)))
	require.Equal(t, "on", lone)
	require.Zero(t, b.g.Stats().Barriers)
	var a, c string
	errs := b.oneFlush(t, nil, syncCommit("a", &a), insertTx("lone"), syncCommit("c", &c))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], db.ErrDuplicate)
	require.NoError(t, errs[2])
	require.Equal(t, "off", a)
	require.Equal(t, "off", c)
	require.Equal(t, uint64(1), b.g.Stats().Barriers)
	require.Equal(t, []string{"a", "c", "lone"}, b.ids(t))
}

// A caller whose context ends while its transaction is queued gets ctx's
// error and nothing of it is written; one whose context ends after its
// transaction was sent gets the transaction's real outcome.
func TestGroupCancelled(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1})
	key, release := holdLock(t, b.pool)
	sentCtx, cancelSent := context.WithCancel(t.Context())
	sentTx := lockTx(key)
	sentTx.Stmts = append(sentTx.Stmts, db.GroupStmt{SQL: "INSERT INTO t (id) VALUES ('sent')"})
	sent := async(sentCtx, b.g, sentTx)
	require.Eventually(t, func() bool { return b.g.Stats().Flushes == 1 }, 10*time.Second, time.Millisecond)

	queuedCtx, cancelQueued := context.WithCancel(t.Context())
	queued := async(queuedCtx, b.g, insertTx("queued"))
	require.Eventually(t, func() bool { return b.g.Stats().Queued == 1 }, 10*time.Second, time.Millisecond)
	cancelQueued()
	require.ErrorIs(t, <-queued, context.Canceled)
	cancelSent()
	select {
	case err := <-sent:
		t.Fatalf("a sent transaction answered %v before its outcome", err)
	case <-time.After(20 * time.Millisecond):
	}
	release()
	require.NoError(t, <-sent)
	require.NoError(t, b.g.Do(t.Context(), insertTx("later")))
	st := b.g.Stats()
	require.Equal(t, uint64(1), st.Withdrawn)
	require.Equal(t, uint64(2), st.Txs, "the withdrawn transaction was never sent")
	require.Equal(t, []string{"later", "sent"}, b.ids(t))
}

// Close refuses new transactions and sends those still queued before it
// returns.
func TestGroupCloseDrains(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1})
	key, release := holdLock(t, b.pool)
	blocker := async(t.Context(), b.g, lockTx(key))
	require.Eventually(t, func() bool { return b.g.Stats().Flushes == 1 }, 10*time.Second, time.Millisecond)
	queued := make([]<-chan error, 5)
	for i := range queued {
		queued[i] = async(t.Context(), b.g, insertTx(string(rune('a'+i))))
	}
	require.Eventually(t, func() bool { return b.g.Stats().Queued == 5 }, 10*time.Second, time.Millisecond)
	closed := make(chan struct{})
	go func() { b.g.Close(); close(closed) }()
	// A cancelled context is never queued, so asking cannot block.
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	require.Eventually(t, func() bool {
		return errors.Is(b.g.Do(cancelled, insertTx("late")), db.ErrGroupClosed)
	}, 10*time.Second, time.Millisecond)
	select {
	case <-closed:
		t.Fatal("Close returned with transactions queued")
	default:
	}
	release()
	<-closed
	require.NoError(t, <-blocker)
	for _, ch := range queued {
		require.NoError(t, <-ch)
	}
	require.Equal(t, []string{"a", "b", "c", "d", "e"}, b.ids(t))
}

func TestGroupConfigValidate(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	for _, tc := range []struct {
		name string
		cfg  db.GroupConfig
		want string
	}{
		{"negative batch", db.GroupConfig{MaxBatch: -1}, "MaxBatch"},
		{"negative lanes", db.GroupConfig{Lanes: -2}, "Lanes"},
		{"negative delay", db.GroupConfig{MaxDelay: -time.Second}, "MaxDelay"},
		{"negative acquire", db.GroupConfig{AcquireTimeout: -time.Second}, "AcquireTimeout"},
		{"negative flush", db.GroupConfig{FlushTimeout: -time.Second}, "FlushTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.NewGroup(pool, tc.cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// Through a transaction pooler each transaction carries the session
// settings and the isolation guard, statements are parsed unnamed, and a
// refusal in the middle of a write still stays its transaction's own.
func TestGroupThroughPgBouncer(t *testing.T) {
	t.Parallel()
	direct := dbtest.Schema(t)
	b := setupGroup(t, dbtest.PgBouncer(t, direct), db.GroupConfig{Lanes: 1})
	locks, err := db.Open(t.Context(), direct, 2)
	require.NoError(t, err)
	t.Cleanup(locks.Close)
	b.locks = locks
	_, err = b.pool.Exec(t.Context(), "INSERT INTO t (id) VALUES ('taken')")
	require.NoError(t, err)
	var isolation, timeout string
	errs := b.oneFlush(t, nil,
		insertTx("one"),
		&db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"two"}},
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"taken"}},
		}},
		&db.GroupTx{Stmts: []db.GroupStmt{
			{SQL: "SELECT current_setting('transaction_isolation'), current_setting('statement_timeout')",
				Row: func(r pgx.Row) error { return r.Scan(&isolation, &timeout) }},
			{SQL: "INSERT INTO t (id) VALUES ($1)", Args: []any{"three"}},
		}},
	)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], db.ErrDuplicate)
	require.NoError(t, errs[2])
	require.Equal(t, "read committed", isolation)
	require.Equal(t, db.StatementTimeout, timeout)
	require.Equal(t, []string{"one", "taken", "three"}, b.ids(t))
}

// The statement that opens a group's transaction behind a pooler refuses
// a transaction that is not READ COMMITTED, which no test can make a
// pooled backend's default: checked here in transactions that pin it.
func TestGroupIsolationGuard(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	for _, tc := range []struct {
		begin string
		want  string
	}{
		{"BEGIN ISOLATION LEVEL READ COMMITTED", ""},
		{"BEGIN ISOLATION LEVEL REPEATABLE READ", "transaction isolation is repeatable read, not read committed"},
		{"BEGIN ISOLATION LEVEL SERIALIZABLE", "transaction isolation is serializable, not read committed"},
	} {
		t.Run(tc.begin, func(t *testing.T) {
			err := pgx.BeginTxFunc(t.Context(), pool, pgx.TxOptions{BeginQuery: tc.begin}, func(tx pgx.Tx) error {
				_, err := tx.Exec(t.Context(), db.SQLGroupSessionSettings)
				return err
			})
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A flush that runs past FlushTimeout is ended by the watchdog: its
// transaction is unknown, Recheck can end the session it ran on, and the
// group goes on serving.
func TestGroupFlushTimeout(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1, FlushTimeout: 200 * time.Millisecond})
	ctx := t.Context()
	key, release := holdLock(t, b.locks)
	stuck := lockTx(key)
	stuck.Stmts = append(stuck.Stmts, db.GroupStmt{SQL: "INSERT INTO t (id) VALUES ('stuck')"})
	err := b.g.Do(ctx, stuck)
	var lost *db.OutcomeUnknownError
	require.ErrorAs(t, err, &lost)
	require.ErrorIs(t, err, db.ErrUnavailable)
	require.NotZero(t, lost.PID)
	require.NoError(t, db.Recheck(ctx, b.pool, lost, func(context.Context) bool { return true }))
	release()
	require.NoError(t, b.g.Do(ctx, insertTx("after")))
	require.Equal(t, []string{"after"}, b.ids(t))
	require.Equal(t, uint64(1), b.g.Stats().Unknown)
}

// Close waits for a flush that a caller runs in its own goroutine, with
// nothing queued behind it.
func TestGroupCloseWaitsForACallersFlush(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1})
	key, release := holdLock(t, b.locks)
	blocker := async(t.Context(), b.g, lockTx(key))
	require.Eventually(t, func() bool { return b.g.Stats().Flushes == 1 }, 10*time.Second, time.Millisecond)
	closed := make(chan struct{})
	go func() { b.g.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned with a flush in flight")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	<-closed
	require.NoError(t, <-blocker)
}

// Under SharedCommit a flush of several transactions is one transaction:
// they commit together (one xid, so one commit and one WAL flush); when
// one is refused, the server rolls the flush back whole and the group
// sends each again with a Sync of its own, so that only the refused one
// fails and the others commit.
func TestGroupSharedCommit(t *testing.T) {
	t.Parallel()
	b := setupGroup(t, dbtest.Schema(t), db.GroupConfig{Lanes: 1, SharedCommit: true})
	_, err := b.pool.Exec(t.Context(), "CREATE TABLE x (id text PRIMARY KEY, xid xid8 NOT NULL)")
	require.NoError(t, err)
	xidTx := func(id string) *db.GroupTx {
		return &db.GroupTx{LockTimeout: time.Second, Stmts: []db.GroupStmt{
			{SQL: "INSERT INTO x VALUES ($1, pg_current_xact_id()) RETURNING id", Args: []any{id}, Row: func(r pgx.Row) error { return r.Scan(new(string)) }}}}
	}
	errs := b.oneFlush(t, nil, xidTx("a"), xidTx("b"), xidTx("c"))
	for _, err := range errs {
		require.NoError(t, err)
	}
	var xids int
	require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT count(DISTINCT xid) FROM x WHERE id IN ('a', 'b', 'c')").Scan(&xids))
	require.Equal(t, 1, xids, "the flush committed as one transaction")
	require.Zero(t, b.g.Stats().Unshared)

	_, err = b.pool.Exec(t.Context(), "INSERT INTO x VALUES ('taken', pg_current_xact_id())")
	require.NoError(t, err)
	errs = b.oneFlush(t, nil, xidTx("d"), xidTx("taken"), xidTx("e"))
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], db.ErrDuplicate)
	require.NoError(t, errs[2])
	require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT count(DISTINCT xid) FROM x WHERE id IN ('d', 'e')").Scan(&xids))
	require.Equal(t, 2, xids, "sent again, each committed on its own")
	st := b.g.Stats()
	require.Equal(t, uint64(1), st.Unshared)
	require.Equal(t, uint64(1), st.Refused)
}
