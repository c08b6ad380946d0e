package mcpserver_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/mcpserver"
	"github.com/quillhq/quill/internal/notes"
)

// settledFile finds the record file of key in the journal directory dir,
// wherever the journal keeps it (the name is the key's digest, as the
// journal names it).
func settledFile(t *testing.T, dir, key string) string {
	t.Helper()
	j, err := client.OpenFileJournal(dir)
	require.NoError(t, err)
	e, err := j.Get(t.Context(), key)
	require.NoError(t, err)
	require.NotNil(t, e.Settled)
	rec, err := client.MarshalRecord(e)
	require.NoError(t, err)
	var found string
	require.NoError(t, filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		if b, rerr := os.ReadFile(p); rerr == nil && string(b) == string(rec) {
			found = p
		}
		return nil
	}))
	require.NotEmpty(t, found)
	return found
}

// A settled operation is no concern of the calls that follow: its record,
// damaged, neither reaches create_note nor list_operations (which read the
// unsettled operations only).
func TestACorruptSettledRecordDoesNotReachTheCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, out := b.call("create_note", map[string]any{"title": "settled long ago"})
	require.Equal(t, "completed", out["state"])
	path := settledFile(t, b.journal, out["operation_key"].(string))
	require.NoError(t, os.WriteFile(path, []byte("quill-journal-v1 1 00\nx"), 0o600))

	res, out := b.call("create_note", map[string]any{"title": "after the damage"})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	res, list := b.call("list_operations", nil)
	require.False(t, res.IsError, textOf(res))
	require.Empty(t, list["warning"], "a settled record is not read by list_operations")
	require.NotContains(t, textOf(res), "could not be read")
}

// The journal prunes itself by the server's key retention, from start-up
// on: settled operations older than it go, recent ones stay, and an
// unsettled one past it is kept (only an explicit abandon removes it).
func TestTheJournalPrunesItselfByTheServersKeyRetention(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	api := apitest.StartWith(t, notes.Config{Wait: 2 * time.Second, ResponseRetention: time.Hour, KeyRetention: 2 * time.Hour})
	dir := t.TempDir()
	j, err := client.OpenFileJournal(dir)
	require.NoError(t, err)
	now := time.Now().UTC()
	record := func(key string, created time.Time, settled *time.Time) {
		t.Helper()
		_, err := j.Begin(ctx, client.JournalEntry{Key: key, Action: contract.ActionCreateNote,
			Params: json.RawMessage(`{"title":"` + key + `"}`), CreatedAt: created})
		require.NoError(t, err)
		if settled != nil {
			require.NoError(t, j.Settle(ctx, key, client.Settlement{State: client.StateCompleted, Status: 201,
				Body: json.RawMessage(`{"id":"x"}`), At: *settled}))
			// Its file was written then, as a real clock would have.
			require.NoError(t, os.Chtimes(settledFile(t, dir, key), *settled, *settled))
		}
	}
	old, recent := now.Add(-3*time.Hour), now.Add(-time.Minute)
	record("settled-old", old.Add(-time.Minute), &old)
	record("settled-recent", recent.Add(-time.Minute), &recent)
	record("unsettled-expired", old, nil)

	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, Journal: j, Attempts: 2,
		Deadline: 3 * time.Second, BaseDelay: 5 * time.Millisecond})
	require.NoError(t, err)
	srv := mcpserver.New(c, mcpserver.Config{Version: "test", PruneInterval: 50 * time.Millisecond})
	runCtx, stop := context.WithCancel(ctx)
	st, ct := mcp.NewInMemoryTransports()
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(runCtx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		stop()
		_ = cs.Close()
		<-ran
	})

	require.Eventually(t, func() bool {
		_, err := j.Get(ctx, "settled-old")
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "the settled operation past the key retention is pruned at start-up")
	_, err = j.Get(ctx, "settled-old")
	require.ErrorIs(t, err, client.ErrNotJournalled)
	e, err := j.Get(ctx, "settled-recent")
	require.NoError(t, err)
	require.NotNil(t, e.Settled)
	e, err = j.Get(ctx, "unsettled-expired")
	require.NoError(t, err, "an unsettled operation is never pruned without an explicit abandon")
	require.Nil(t, e.Settled)

	// And again every PruneInterval.
	record("settled-old-later", old.Add(-time.Minute), &old)
	require.Eventually(t, func() bool {
		_, err := j.Get(ctx, "settled-old-later")
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "pruned by a later pass")
}
