package client

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// topRecords lists the record files in the journal's own directory: where
// Unsettled, and so every create_note, reads.
func topRecords(t *testing.T, j *FileJournal) []string {
	t.Helper()
	des, err := os.ReadDir(j.Dir())
	require.NoError(t, err)
	var out []string
	for _, de := range des {
		if !de.IsDir() && strings.HasSuffix(de.Name(), ".op") {
			out = append(out, de.Name())
		}
	}
	return out
}

// recordFile finds key's record file wherever in the journal it is.
func recordFile(t *testing.T, j *FileJournal, key string) string {
	t.Helper()
	want := filepath.Base(j.path(key))
	var found string
	require.NoError(t, filepath.WalkDir(j.Dir(), func(p string, de fs.DirEntry, err error) error {
		if err == nil && !de.IsDir() && de.Name() == want {
			found = p
		}
		return err
	}))
	require.NotEmpty(t, found, "no record of %q", key)
	return found
}

// A settled operation leaves the directory that the per-call path reads:
// however many operations are settled, Unsettled reads only the unsettled
// ones.
func TestSettledRecordsLeaveTheUnsettledPath(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	j, err := OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	for _, k := range []string{"a", "b", "c"} {
		_, err := j.Begin(ctx, entry(k))
		require.NoError(t, err)
	}
	for _, k := range []string{"a", "c"} {
		require.NoError(t, j.Settle(ctx, k, Settlement{State: StateCompleted, Status: 201, At: time.Now()}))
	}
	require.Equal(t, []string{filepath.Base(j.path("b"))}, topRecords(t, j), "only the unsettled record stays where Unsettled reads")
	e, err := j.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, StateCompleted, e.Settled.State, "a settled record is still found by its key")

	// Begun again (a retry of the same key), it is unsettled again, with
	// its first CreatedAt, and settles aside again.
	again := entry("a")
	again.CreatedAt = again.CreatedAt.Add(time.Hour)
	got, err := j.Begin(ctx, again)
	require.NoError(t, err)
	require.Equal(t, entry("a").CreatedAt, got.CreatedAt.UTC())
	un, err := j.Unsettled(ctx)
	require.NoError(t, err)
	require.Len(t, un, 2)
	e, err = j.Get(ctx, "a")
	require.NoError(t, err)
	require.Nil(t, e.Settled)
	require.NoError(t, j.Settle(ctx, "a", Settlement{State: StateRefused, Status: 422, At: time.Now()}))
	e, err = j.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, StateRefused, e.Settled.State)
	require.Len(t, topRecords(t, j), 1)
}

// A damaged settled record is no concern of the per-call path: Unsettled
// neither reads nor reports it; Get of its key still reports it.
func TestACorruptSettledRecordDoesNotReachUnsettled(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	j, err := OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	for _, k := range []string{"done", "open"} {
		_, err := j.Begin(ctx, entry(k))
		require.NoError(t, err)
	}
	require.NoError(t, j.Settle(ctx, "done", Settlement{State: StateCompleted, Status: 201, At: time.Now()}))
	require.NoError(t, os.WriteFile(recordFile(t, j, "done"), []byte("quill-journal-v1 3 00\nbad"), 0o600))

	un, err := j.Unsettled(ctx)
	require.NoError(t, err)
	require.Len(t, un, 1)
	require.Equal(t, "open", un[0].Key)
	_, err = j.Get(ctx, "done")
	require.ErrorIs(t, err, ErrCorruptRecord)
}

// A crash inside Settle, after the settled copy was written and before
// the unsettled record was removed, leaves both: the unsettled one wins,
// as if Settle had not happened, and the next Settle tidies up.
func TestACrashInsideSettleLeavesItUnsettled(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	j, err := OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	_, err = j.Begin(ctx, entry("k"))
	require.NoError(t, err)
	settled := entry("k")
	settled.Settled = &Settlement{State: StateCompleted, Status: 201, At: time.Now().UTC()}
	rec, err := MarshalRecord(settled)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(j.settledPath("k"), rec, 0o600))

	un, err := j.Unsettled(ctx)
	require.NoError(t, err)
	require.Len(t, un, 1)
	e, err := j.Get(ctx, "k")
	require.NoError(t, err)
	require.Nil(t, e.Settled, "the unsettled record wins")

	require.NoError(t, j.Settle(ctx, "k", Settlement{State: StateCompleted, Status: 201, At: time.Now()}))
	require.Empty(t, topRecords(t, j))
	e, err = j.Get(ctx, "k")
	require.NoError(t, err)
	require.NotNil(t, e.Settled)
}

// A journal written before settled records were moved aside holds them
// beside the unsettled ones; Prune moves those it keeps aside, so that
// the per-call path stops reading them.
func TestPruneMovesOldSettledRecordsAside(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	j, err := OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	now := time.Now().UTC()
	for _, tc := range []struct {
		key     string
		settled time.Duration
	}{{"recent", time.Hour}, {"old", 800 * time.Hour}} {
		e := entry(tc.key)
		e.Settled = &Settlement{State: StateCompleted, Status: 201, Body: json.RawMessage(`{"id":"x"}`), At: now.Add(-tc.settled)}
		rec, err := MarshalRecord(e)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(j.path(tc.key), rec, 0o600))
	}
	_, err = j.Begin(ctx, entry("open"))
	require.NoError(t, err)

	res, err := j.Prune(ctx, now.Add(-720*time.Hour), now.Add(-720*time.Hour), false)
	require.NoError(t, err)
	require.Equal(t, []string{"old"}, res.Removed)
	require.Equal(t, []string{filepath.Base(j.path("open"))}, topRecords(t, j))
	e, err := j.Get(ctx, "recent")
	require.NoError(t, err)
	require.NotNil(t, e.Settled)
	_, err = j.Get(ctx, "old")
	require.ErrorIs(t, err, ErrNotJournalled)
}
