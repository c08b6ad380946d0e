package client

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
)

func entry(key string) JournalEntry {
	return JournalEntry{Key: key, Action: contract.ActionCreateNote, Params: json.RawMessage(`{"title":"t"}`),
		CreatedAt: time.Date(2026, 10, 14, 12, 0, 0, 0, time.UTC)}
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	e := entry("k/1")
	e.Settled = &Settlement{State: StateCompleted, Status: 201, Body: json.RawMessage(`{"id":"x"}`), At: e.CreatedAt}
	b, err := MarshalRecord(e)
	require.NoError(t, err)
	got, err := ParseRecord(b)
	require.NoError(t, err)
	require.Equal(t, e.Key, got.Key)
	require.Equal(t, e.Settled.Status, got.Settled.Status)
	require.JSONEq(t, string(e.Params), string(got.Params))
}

func TestParseRecordRejectsDamage(t *testing.T) {
	t.Parallel()
	good, err := MarshalRecord(entry("k-1"))
	require.NoError(t, err)
	flipped := bytes.Clone(good)
	flipped[len(flipped)-3] ^= 0x01
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header only, torn", good[:bytes.IndexByte(good, '\n')]},
		{"torn in the payload", good[:len(good)-5]},
		{"one byte missing", good[:len(good)-1]},
		{"trailing garbage", append(bytes.Clone(good), 'x')},
		{"bit flip", flipped},
		{"wrong magic", bytes.Replace(good, []byte("quill-journal-v1"), []byte("quill-journal-v2"), 1)},
		{"zeros", make([]byte, 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseRecord(tc.b)
			require.ErrorIs(t, err, ErrCorruptRecord)
		})
	}
}

func FuzzParseRecord(f *testing.F) {
	good, err := MarshalRecord(entry("k-1"))
	require.NoError(f, err)
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte("quill-journal-v1 2 00\n{}"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := ParseRecord(b)
		if err != nil {
			return
		}
		// What parses is a valid entry that survives a round trip.
		again, err := MarshalRecord(e)
		require.NoError(t, err)
		e2, err := ParseRecord(again)
		require.NoError(t, err)
		require.Equal(t, e.Key, e2.Key)
		require.Equal(t, e.Action, e2.Action)
	})
}

func TestFileJournal(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	j, err := OpenFileJournal(dir)
	require.NoError(t, err)

	a, b := entry("a"), entry("b")
	b.CreatedAt = a.CreatedAt.Add(time.Second)
	_, err = j.Begin(ctx, b)
	require.NoError(t, err)
	_, err = j.Begin(ctx, a)
	require.NoError(t, err)

	// Begin again keeps the first CreatedAt: the key's age counts from
	// its first send.
	later := a
	later.CreatedAt = a.CreatedAt.Add(time.Hour)
	got, err := j.Begin(ctx, later)
	require.NoError(t, err)
	require.Equal(t, a.CreatedAt, got.CreatedAt.UTC())

	un, err := j.Unsettled(ctx)
	require.NoError(t, err)
	require.Len(t, un, 2)
	require.Equal(t, "a", un[0].Key, "oldest first")

	require.NoError(t, j.Settle(ctx, "a", Settlement{State: StateCompleted, Status: 201, At: time.Now()}))
	un, err = j.Unsettled(ctx)
	require.NoError(t, err)
	require.Len(t, un, 1)
	require.Equal(t, "b", un[0].Key)
	e, err := j.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, StateCompleted, e.Settled.State)

	require.ErrorIs(t, j.Settle(ctx, "nope", Settlement{State: StateCompleted}), ErrNotJournalled)
	_, err = j.Get(ctx, "nope")
	require.ErrorIs(t, err, ErrNotJournalled)

	// Files are private: records hold titles and bodies.
	fi, err := os.Stat(j.path("b"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

func TestFileJournalSurvivesACrashMidWrite(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	j, err := OpenFileJournal(dir)
	require.NoError(t, err)
	_, err = j.Begin(ctx, entry("a"))
	require.NoError(t, err)

	// A crash during Settle leaves a temporary file that was never
	// renamed: the previous record stands and the temp file is ignored.
	rec, err := MarshalRecord(entry("a"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".tmp-123"), rec[:len(rec)/2], 0o600))

	// A record torn by some other means (a disk that lied about fsync)
	// is reported, not trusted, and does not hide the others.
	torn, err := MarshalRecord(entry("torn"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(j.path("torn"), torn[:len(torn)-7], 0o600))

	un, err := j.Unsettled(ctx)
	require.ErrorIs(t, err, ErrCorruptRecord)
	require.Len(t, un, 1)
	require.Equal(t, "a", un[0].Key)
}

func TestJournalRefusesBadEntries(t *testing.T) {
	t.Parallel()
	j, err := OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	for _, e := range []JournalEntry{
		{Key: "", Action: contract.ActionCreateNote, Params: json.RawMessage(`{}`), CreatedAt: time.Now()},
		{Key: "has space", Action: contract.ActionCreateNote, Params: json.RawMessage(`{}`), CreatedAt: time.Now()},
		{Key: "k", Action: "explode", Params: json.RawMessage(`{}`), CreatedAt: time.Now()},
		{Key: "k", Action: contract.ActionCreateNote, Params: json.RawMessage(`{`), CreatedAt: time.Now()},
		{Key: "k", Action: contract.ActionCreateNote, Params: json.RawMessage(`{}`)},
	} {
		_, err := j.Begin(testContext(t), e)
		require.Error(t, err, "%+v", e)
	}
}

// TestFileJournalPrune removes settled records older than the cutoff, keeps
// recent ones and unsettled ones, lists unsettled operations past the key
// retention — removing them only when told to abandon them — and keeps a
// damaged record, reporting it.
func TestFileJournalPrune(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dir := t.TempDir()
	j, err := OpenFileJournal(dir)
	require.NoError(t, err)
	now := time.Now()
	begin := func(key string, created time.Time, settled *time.Time) {
		t.Helper()
		e := entry(key)
		e.CreatedAt = created
		_, err := j.Begin(ctx, e)
		require.NoError(t, err)
		if settled != nil {
			require.NoError(t, j.Settle(ctx, key, Settlement{State: StateCompleted, Status: 201, At: *settled}))
			// Settled then, as a real clock would have written it.
			require.NoError(t, os.Chtimes(recordFile(t, j, key), *settled, *settled))
		}
	}
	at := func(d time.Duration) *time.Time { x := now.Add(-d); return &x }
	begin("settled-old", now.Add(-50*24*time.Hour), at(40*24*time.Hour))
	begin("settled-new", now.Add(-2*time.Hour), at(time.Hour))
	begin("unsettled-new", now.Add(-time.Hour), nil)
	begin("unsettled-expired", now.Add(-31*24*time.Hour), nil)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "damaged.op"), []byte("not a record"), 0o600))

	settledBefore, expiredBefore := now.Add(-720*time.Hour), now.Add(-720*time.Hour)
	res, err := j.Prune(ctx, settledBefore, expiredBefore, false)
	require.Error(t, err, "the damaged record is reported")
	require.Equal(t, []string{"settled-old"}, res.Removed)
	require.Empty(t, res.Abandoned)
	require.Len(t, res.Expired, 1)
	require.Equal(t, "unsettled-expired", res.Expired[0].Key)
	_, err = j.Get(ctx, "settled-old")
	require.ErrorIs(t, err, ErrNotJournalled)
	for _, k := range []string{"settled-new", "unsettled-new", "unsettled-expired"} {
		_, err := j.Get(ctx, k)
		require.NoError(t, err, "%s stays", k)
	}

	res, err = j.Prune(ctx, settledBefore, expiredBefore, true)
	require.Error(t, err)
	require.Empty(t, res.Removed)
	require.Equal(t, []string{"unsettled-expired"}, res.Abandoned)
	require.Empty(t, res.Expired)
	un, _ := j.Unsettled(ctx)
	require.Len(t, un, 1)
	require.Equal(t, "unsettled-new", un[0].Key)
	_, err = os.Stat(filepath.Join(dir, "damaged.op"))
	require.NoError(t, err, "a damaged record is never removed")
}
