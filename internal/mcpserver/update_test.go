package mcpserver_test

import (
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
)

const anID = "0193aaaa-0000-7000-8000-000000000001"

// tool returns the listed tool name.
func (b *testBundle) tool(name string) *mcp.Tool {
	b.t.Helper()
	res, err := b.session.ListTools(b.t.Context(), nil)
	require.NoError(b.t, err)
	for _, tl := range res.Tools {
		if tl.Name == name {
			return tl
		}
	}
	b.t.Fatalf("tool %s is not listed", name)
	return nil
}

// schemaOf returns a tool's input schema as a JSON object.
func schemaOf(t *testing.T, tl *mcp.Tool) map[string]any {
	t.Helper()
	raw, err := json.Marshal(tl.InputSchema)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	return m
}

// update_note's schema: id and expected_version required; title, body and
// operation_key optional; its description sends a 412 to get_note.
func TestUpdateNoteSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	up := b.tool("update_note")
	s := schemaOf(t, up)
	props := s["properties"].(map[string]any)
	for _, p := range []string{"id", "expected_version", "title", "body", "operation_key"} {
		require.Contains(t, props, p)
		require.NotEmpty(t, props[p].(map[string]any)["description"], p)
	}
	require.Len(t, props, 5)
	require.ElementsMatch(t, []any{"id", "expected_version"}, s["required"])
	require.Equal(t, "integer", props["expected_version"].(map[string]any)["type"])
	require.Contains(t, up.Description, "precondition_failed")
	require.Contains(t, up.Description, "get_note")
	require.Contains(t, up.Description, "current_version")
	require.True(t, *up.Annotations.DestructiveHint)

	del := schemaOf(t, b.tool("delete_note"))
	require.Contains(t, del["properties"], "expected_version")
	require.ElementsMatch(t, []any{"id"}, del["required"], "delete_note's expected_version is optional")
	require.Contains(t, b.tool("get_note").Description, "version")
}

// Arguments that cannot make an update are refused before anything is
// journalled or sent.
func TestUpdateNoteArgumentsAreRefusedBeforeAnySend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var writes atomic.Int64
	b.api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				writes.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	})
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"id": anID, "expected_version": 0, "title": "t"}, "expected_version 0"},
		{map[string]any{"id": anID, "expected_version": -2, "title": "t"}, "expected_version -2"},
		{map[string]any{"id": anID, "expected_version": 1}, "nothing to update"},
		{map[string]any{"id": anID, "expected_version": 1, "title": "t", "operation_key": "has space"}, "not a valid key"},
	} {
		res, out := b.call("update_note", tc.args)
		require.True(t, res.IsError, "%v", tc.args)
		require.Equal(t, "refused", out["state"], "%v", tc.args)
		require.NotEmpty(t, out["operation_key"], "%v", tc.args)
		require.Contains(t, textOf(res), tc.want)
		require.Contains(t, textOf(res), "nothing was sent")
	}
	res, out := b.call("delete_note", map[string]any{"id": anID, "expected_version": -1})
	require.True(t, res.IsError)
	require.Equal(t, "refused", out["state"])

	// Without expected_version the call does not reach the tool at all.
	res, err := b.session.CallTool(t.Context(), &mcp.CallToolParams{Name: "update_note", Arguments: map[string]any{"id": anID, "title": "t"}})
	if err == nil {
		require.True(t, res.IsError, "expected_version is required")
	}
	require.Zero(t, writes.Load())
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Empty(t, un)
}

// An unsettled update (and a delete under a version) is listed with its
// parameters named as update_note's arguments.
func TestListOperationsShowsAnUnsettledUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	now := time.Now().UTC()
	_, err = j.Begin(t.Context(), client.JournalEntry{Key: "upd-unsettled", Action: contract.ActionUpdateNote,
		Params: json.RawMessage(`{"id":"` + anID + `","if_version":3,"body":""}`), CreatedAt: now.Add(-time.Second)})
	require.NoError(t, err)
	_, err = j.Begin(t.Context(), client.JournalEntry{Key: "del-unsettled", Action: contract.ActionDeleteNote,
		Params: json.RawMessage(`{"id":"` + anID + `","if_version":4}`), CreatedAt: now})
	require.NoError(t, err)
	res, out := b.call("list_operations", nil)
	require.False(t, res.IsError, textOf(res))
	ops := out["operations"].([]any)
	require.Len(t, ops, 2)
	up := ops[0].(map[string]any)
	require.Equal(t, "upd-unsettled", up["operation_key"])
	require.Equal(t, "update-note", up["action"])
	require.Equal(t, map[string]any{"id": anID, "expected_version": float64(3), "body": ""}, up["params"])
	del := ops[1].(map[string]any)
	require.Equal(t, map[string]any{"id": anID, "expected_version": float64(4)}, del["params"])
}

// update_note against the real API: the next version; a stale
// expected_version is refused with current_version and told to read the
// note, never to retry under a new key; the same key after the note
// changed replays the recorded 200.
func TestUpdateNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, out := b.call("create_note", map[string]any{"title": "draft", "body": "one"})
	require.Equal(t, "completed", out["state"])
	note := out["note"].(map[string]any)
	id := note["id"].(string)
	require.EqualValues(t, 1, note["version"])
	_, got := b.call("get_note", map[string]any{"id": id})
	require.EqualValues(t, 1, got["version"])

	res, out := b.call("update_note", map[string]any{"id": id, "expected_version": 1, "title": "final", "operation_key": "mcp-upd-1"})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	require.Equal(t, "mcp-upd-1", out["operation_key"])
	note = out["note"].(map[string]any)
	require.EqualValues(t, 2, note["version"])
	require.Equal(t, "final", note["title"])
	require.Equal(t, "one", note["body"], "a field not given is kept")

	// Another agent's update from version 1.
	res, out = b.call("update_note", map[string]any{"id": id, "expected_version": 1, "body": "theirs"})
	require.True(t, res.IsError)
	require.Equal(t, "refused", out["state"])
	perr := out["error"].(map[string]any)
	require.Equal(t, "precondition_failed", perr["code"])
	require.Equal(t, "no", perr["retry"])
	require.EqualValues(t, 2, perr["current_version"])
	text := textOf(res)
	require.Contains(t, text, "version 2")
	require.Contains(t, text, "get_note")
	require.Contains(t, text, "NOT applied")
	require.Contains(t, text, "do not repeat it under a new operation_key")
	require.Contains(t, text, out["operation_key"].(string))

	// The note moves on; the first call's key replays its recorded 200.
	_, out = b.call("update_note", map[string]any{"id": id, "expected_version": 2, "body": "two"})
	require.Equal(t, "completed", out["state"])
	res, out = b.call("update_note", map[string]any{"id": id, "expected_version": 1, "title": "final", "operation_key": "mcp-upd-1"})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	require.Equal(t, true, out["replayed"])
	require.EqualValues(t, 2, out["note"].(map[string]any)["version"], "the recorded answer")

	// A delete under a stale version is refused the same way.
	res, out = b.call("delete_note", map[string]any{"id": id, "expected_version": 2})
	require.True(t, res.IsError)
	require.EqualValues(t, 3, out["error"].(map[string]any)["current_version"])
	require.Contains(t, textOf(res), "get_note")
	res, out = b.call("delete_note", map[string]any{"id": id, "expected_version": 3})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])

	_, list := b.call("list_operations", nil)
	require.Equal(t, []any{}, list["operations"])
}

// An update whose answers were lost is unknown (not an error result), is
// listed by list_operations, and the start-up resume finishes it under
// its key.
func TestUnknownUpdateIsListedAndResumed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, out := b.call("create_note", map[string]any{"title": "to update"})
	id := out["note"].(map[string]any)["id"].(string)
	require.NoError(t, b.proxy.SetDropProbability(1))
	res, out := b.call("update_note", map[string]any{"id": id, "expected_version": 1, "body": "later"})
	require.False(t, res.IsError, "an unknown outcome is not an error result")
	require.Equal(t, "unknown", out["state"])
	key := out["operation_key"].(string)
	require.Contains(t, textOf(res), "get_operation")

	_, list := b.call("list_operations", nil)
	ops := list["operations"].([]any)
	require.Len(t, ops, 1)
	require.Equal(t, key, ops[0].(map[string]any)["operation_key"])
	require.Equal(t, "update-note", ops[0].(map[string]any)["action"])

	require.NoError(t, b.proxy.SetDropProbability(0))
	b.server.Resume(t.Context())
	_, list = b.call("list_operations", nil)
	require.Equal(t, []any{}, list["operations"])
	_, got := b.call("get_note", map[string]any{"id": id})
	require.EqualValues(t, 2, got["version"])
	require.Equal(t, "later", got["body"])
}
