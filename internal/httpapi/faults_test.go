package httpapi_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Faults are injected where production runs: in the test's own schema, by
// triggers on the tables every write writes, steered by the rows of a
// table of the test's (test_faults). A write takes the same path with or
// without them; they act inside its statement.
//
//   - fail: the operation record's insert raises once the note is there —
//     after the effect, before the COMMIT.
//   - terminate: the session ends itself at that point, mid-round-trip.
//   - hold: a note's insert waits, inside the write's transaction, on an
//     advisory lock the test holds — the request stays in progress.
const sqlFaults = `
CREATE TABLE test_faults (kind text PRIMARY KEY, title text NOT NULL DEFAULT '', lock_id bigint);

CREATE FUNCTION test_faults_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM test_faults WHERE kind = 'fail')
		AND EXISTS (SELECT 1 FROM notes WHERE tenant = NEW.tenant AND '/v1/notes/' || id = NEW.resource) THEN
		RAISE EXCEPTION 'injected failure before the operation record';
	END IF;
	IF EXISTS (SELECT 1 FROM test_faults WHERE kind = 'terminate') THEN
		PERFORM pg_terminate_backend(pg_backend_pid());
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER test_faults_record AFTER INSERT ON operations FOR EACH ROW EXECUTE FUNCTION test_faults_record();

CREATE FUNCTION test_faults_note() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE l bigint;
BEGIN
	SELECT lock_id INTO l FROM test_faults WHERE kind = 'hold' AND (title = '' OR title = NEW.title);
	IF l IS NOT NULL THEN
		PERFORM set_config('lock_timeout', '0', true);
		PERFORM pg_advisory_xact_lock_shared(l);
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER test_faults_note AFTER INSERT ON notes FOR EACH ROW EXECUTE FUNCTION test_faults_note();`

// fault turns the fault kind on (see sqlFaults) until clearFaults.
func (b *testBundle) fault(kind string) {
	b.t.Helper()
	b.setFault(kind, "", 0)
}

func (b *testBundle) setFault(kind, title string, lockID int64) {
	b.t.Helper()
	if !b.faulted {
		_, err := b.pool.Exec(context.Background(), sqlFaults)
		require.NoError(b.t, err)
		b.faulted = true
	}
	_, err := b.pool.Exec(context.Background(), `INSERT INTO test_faults (kind, title, lock_id) VALUES ($1, $2, nullif($3, 0))
		ON CONFLICT (kind) DO UPDATE SET title = EXCLUDED.title, lock_id = EXCLUDED.lock_id`, kind, title, lockID)
	require.NoError(b.t, err)
}

// clearFaults turns every fault off for the writes that start from now
// on; a write already held stays held until its release.
func (b *testBundle) clearFaults() {
	b.t.Helper()
	if b.faulted {
		_, err := b.pool.Exec(context.Background(), `DELETE FROM test_faults`)
		require.NoError(b.t, err)
	}
}

// holdWrites makes every write of a note titled title ("" any note) wait
// inside its transaction, after its note's insert, until the returned
// release is called (at the latest when the test ends); entered receives
// one value per write that got there.
func (b *testBundle) holdWrites(title string) (entered <-chan struct{}, release func()) {
	b.t.Helper()
	ctx := context.Background()
	lockID := rand.Int64N(1<<31-1) + 1
	holder, err := pgx.Connect(ctx, b.pool.Config().ConnConfig.ConnString())
	require.NoError(b.t, err)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID)
	require.NoError(b.t, err)
	b.setFault("hold", title, lockID)
	in := make(chan struct{}, 64)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		// Each write waiting on the lock is a write that got there.
		defer close(done)
		seen := 0
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var n int
			if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
				AND classid = 0 AND objid::bigint = $1 AND objsubid = 1`, lockID).Scan(&n); err != nil {
				continue
			}
			for ; seen < n; seen++ {
				in <- struct{}{}
			}
		}
	}()
	var released bool
	release = func() {
		if released {
			return
		}
		released = true
		close(stop)
		<-done
		_, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockID)
		require.NoError(b.t, err, fmt.Sprintf("release lock %d", lockID))
		_ = holder.Close(ctx)
	}
	b.t.Cleanup(release)
	return in, release
}
