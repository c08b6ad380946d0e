package mcpserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// cancelMidFlight calls create_note with args and cancels the call once
// its request reached the API; it returns after the note was created by
// that abandoned request.
func (b *testBundle) cancelMidFlight(args map[string]any) {
	b.t.Helper()
	arrived, release := b.api.HoldFirstCreate(b.t)
	ctx, cancel := context.WithCancel(b.t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := b.session.CallTool(ctx, &mcp.CallToolParams{Name: "create_note", Arguments: args})
		done <- err
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		b.t.Fatal("the create_note request never reached the API")
	}
	cancel()
	require.Error(b.t, <-done, "the host cancelled the call: no result")
	close(release)
	b.waitNotes(args["title"].(string), 1)
}

// restartAfterCancel is cancelMidFlight followed by a restart of the MCP
// server over the same journal, without its start-up resume.
func (b *testBundle) restartAfterCancel(args map[string]any) {
	b.t.Helper()
	b.cancelMidFlight(args)
	require.NoError(b.t, b.session.Close())
	b.connect()
}

// askAgain calls create_note with args and requires the answer to be the
// earlier, cancelled operation's: completed, and resumed rather than
// written anew.
func (b *testBundle) askAgain(args map[string]any) (*mcp.CallToolResult, map[string]any) {
	b.t.Helper()
	res, out := b.call("create_note", args)
	require.False(b.t, res.IsError, textOf(res))
	require.Equal(b.t, "completed", out["state"])
	require.Equal(b.t, true, out["resumed"])
	return res, out
}

// waitNotes polls until the tenant has n notes titled title.
func (b *testBundle) waitNotes(title string, n int) {
	b.t.Helper()
	require.Eventually(b.t, func() bool { return b.api.Notes(b.t, title) == n }, 10*time.Second, 10*time.Millisecond)
}

// The host cancels create_note after the request left; the model, which
// never saw the key, asks again with the same parameters and no key: the
// earlier operation is finished and answered, not written a second time.
func TestCancelledCreateAskedAgainMakesOneNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	args := map[string]any{"title": "lost result", "body": "b"}
	b.cancelMidFlight(args)

	res, out := b.askAgain(args)
	require.Equal(t, true, out["replayed"], "the abandoned request had executed it")
	key := out["operation_key"].(string)
	require.NotEmpty(t, key)
	require.Contains(t, textOf(res), key)
	require.Contains(t, textOf(res), "new_intent")
	require.Equal(t, 1, b.api.Notes(t, "lost result"))

	// Settled now: a further identical request is a new intent.
	_, out = b.call("create_note", args)
	require.Equal(t, "completed", out["state"])
	require.NotEqual(t, key, out["operation_key"])
	require.Nil(t, out["resumed"])
	require.Equal(t, 2, b.api.Notes(t, "lost result"))
}

// The MCP server restarts between the cancelled call and the model's
// second one, and its start-up resume finishes the operation first: the
// second call still answers that operation instead of writing.
func TestRestartBetweenTheCallsMakesOneNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	args := map[string]any{"title": "across a restart"}
	b.restartAfterCancel(args)
	b.server.Resume(t.Context())
	_, out := b.call("list_operations", nil)
	require.Empty(t, out["operations"], "the resume settled it")

	_, out = b.askAgain(args)
	require.Equal(t, "across a restart", out["note"].(map[string]any)["title"])
	require.Equal(t, 1, b.api.Notes(t, "across a restart"))
}

// The same, with the second call arriving before any resume.
func TestRestartThenAskAgainBeforeResumeMakesOneNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	args := map[string]any{"title": "restart, no resume"}
	b.restartAfterCancel(args)
	b.askAgain(args)
	require.Equal(t, 1, b.api.Notes(t, "restart, no resume"))
}

// new_intent: true says the user wants another, identical note.
func TestNewIntentWritesASecondNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	args := map[string]any{"title": "twice on purpose"}
	b.cancelMidFlight(args)

	res, out := b.call("create_note", map[string]any{"title": "twice on purpose", "new_intent": true})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	require.Nil(t, out["resumed"])
	require.Equal(t, 2, b.api.Notes(t, "twice on purpose"))
}

// Parameters that differ in anything are another request.
func TestOtherParametersAreNotMatched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cancelMidFlight(map[string]any{"title": "similar", "body": "one"})
	_, out := b.call("create_note", map[string]any{"title": "similar", "body": "two"})
	require.Equal(t, "completed", out["state"])
	require.Nil(t, out["resumed"])
	require.Equal(t, 2, b.api.Notes(t, "similar"))
}

func TestListOperationsListsTheUnsettledOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, out := b.call("list_operations", nil)
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, []any{}, out["operations"])

	b.cancelMidFlight(map[string]any{"title": "unsettled", "body": "b",
		"attachment": map[string]any{"filename": "a.txt", "content_type": "text/plain", "data": "aGkK"}})
	res, out = b.call("list_operations", nil)
	require.False(t, res.IsError, textOf(res))
	ops := out["operations"].([]any)
	require.Len(t, ops, 1)
	op := ops[0].(map[string]any)
	key := op["operation_key"].(string)
	require.NotEmpty(t, key)
	require.Contains(t, textOf(res), key)
	require.Equal(t, "create-note", op["action"])
	require.Equal(t, map[string]any{"title": "unsettled", "body": "b",
		"attachment": map[string]any{"filename": "a.txt", "content_type": "text/plain", "size_bytes": float64(3)}}, op["params"])
	require.GreaterOrEqual(t, op["age_seconds"], float64(0))
	require.NotEmpty(t, op["first_sent_at"])

	// Finishing it by its key settles it.
	_, out = b.call("get_operation", map[string]any{"operation_key": key})
	require.Equal(t, "completed", out["state"])
	_, out = b.call("create_note", map[string]any{"title": "unsettled", "body": "b", "operation_key": key,
		"attachment": map[string]any{"filename": "a.txt", "content_type": "text/plain", "data": "aGkK"}})
	require.Equal(t, "completed", out["state"])
	_, out = b.call("list_operations", nil)
	require.Equal(t, []any{}, out["operations"])
	require.Equal(t, 1, b.api.Notes(t, "unsettled"))
}

// Every write result carries its operation key, error results included.
func TestEveryWriteResultCarriesTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, args := range map[string]map[string]any{
		"bad base64": {"title": "x", "attachment": map[string]any{"filename": "a", "content_type": "text/plain", "data": "!!"}},
		"bad key":    {"title": "x", "operation_key": "has space"},
		"invalid":    {"title": ""},
	} {
		res, out := b.call("create_note", args)
		require.True(t, res.IsError, name)
		key, _ := out["operation_key"].(string)
		require.NotEmpty(t, key, name)
		require.Contains(t, textOf(res), key, name)
	}
	res, out := b.call("delete_note", map[string]any{"id": "no-such-note"})
	require.True(t, res.IsError)
	require.Contains(t, textOf(res), out["operation_key"].(string))
	res, out = b.call("get_operation", map[string]any{"operation_key": "never-sent"})
	require.False(t, res.IsError)
	require.Equal(t, "never-sent", out["operation_key"])
}
