package client

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConcurrentJournalWritersLoseNothing runs two journals over one
// directory, as two quill processes would: one settles operations while the
// other journals them again with new parameters (a resend after an edit),
// and a third prunes. Each is a read-modify-write of the same record; without
// the lock one overwrites the other's record with what it read before, and
// a Begin that returned is lost.
func TestConcurrentJournalWritersLoseNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	j1, err := OpenFileJournal(dir)
	require.NoError(t, err)
	j2, err := OpenFileJournal(dir)
	require.NoError(t, err)
	j3, err := OpenFileJournal(dir)
	require.NoError(t, err)
	const n = 60
	key := func(i int) string { return fmt.Sprintf("k-%03d", i) }
	params := func(v int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"title":"v%d"}`, v)) }
	for i := range n {
		e := entry(key(i))
		e.Params = params(1)
		_, err := j1.Begin(ctx, e)
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range n {
			require.NoError(t, j1.Settle(ctx, key(i), Settlement{State: StateCompleted, Status: 201, At: time.Unix(0, 0)}))
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range n {
			e := entry(key(i))
			e.Params = params(2)
			_, err := j2.Begin(ctx, e)
			require.NoError(t, err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			// Prune removes settled records only; an unsettled one,
			// journalled again meanwhile, must stay.
			_, err := j3.Prune(ctx, time.Unix(1, 0), time.Time{}, false)
			require.NoError(t, err)
		}
	}()
	wg.Wait()
	for i := range n {
		e, err := j1.Get(ctx, key(i))
		if e.Settled != nil || err != nil {
			// Settled after the second Begin, or settled and pruned:
			// both are serial orders; what was settled must be v2's
			// record or gone.
			if err == nil {
				require.JSONEq(t, string(params(2)), string(e.Params), "%s: the second Begin was overwritten", key(i))
			}
			continue
		}
		require.JSONEq(t, string(params(2)), string(e.Params), key(i))
	}
}

func TestStaleTempFilesAreRemovedAtOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j, err := OpenFileJournal(dir)
	require.NoError(t, err)
	_, err = j.Begin(testContext(t), entry("a"))
	require.NoError(t, err)
	old := filepath.Join(dir, ".tmp-1234")
	fresh := filepath.Join(dir, ".tmp-5678")
	require.NoError(t, os.WriteFile(old, []byte("half a rec"), 0o600))
	require.NoError(t, os.WriteFile(fresh, []byte("being written"), 0o600))
	long := time.Now().Add(-2 * staleTempAge)
	require.NoError(t, os.Chtimes(old, long, long))

	// While another process holds the lock, nothing is removed.
	unlock, err := j.lock(testContext(t))
	require.NoError(t, err)
	_, err = OpenFileJournal(dir)
	require.NoError(t, err)
	require.FileExists(t, old)
	unlock()

	_, err = OpenFileJournal(dir)
	require.NoError(t, err)
	require.NoFileExists(t, old, "a crashed write's temp file is removed")
	require.FileExists(t, fresh, "a recent one may be a live writer's (of a version without the lock)")
	e, err := j.Get(testContext(t), "a")
	require.NoError(t, err)
	require.Equal(t, "a", e.Key, "records are untouched")
}

func TestAChangeWaitsForTheLockThenGivesUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j1, err := OpenFileJournal(dir)
	require.NoError(t, err)
	j2, err := OpenFileJournal(dir)
	require.NoError(t, err)
	j2.LockWait = 200 * time.Millisecond

	unlock, err := j1.lock(testContext(t))
	require.NoError(t, err)
	start := time.Now()
	_, err = j2.Begin(testContext(t), entry("a"))
	require.ErrorIs(t, err, ErrJournalLocked)
	require.Contains(t, err.Error(), dir)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)

	// A holder that lets go within the wait is waited for.
	j2.LockWait = 10 * time.Second
	done := make(chan error, 1)
	go func() {
		_, err := j2.Begin(testContext(t), entry("a"))
		done <- err
	}()
	unlock()
	require.NoError(t, <-done)
	_, err = j1.Get(testContext(t), "a")
	require.NoError(t, err)
}
