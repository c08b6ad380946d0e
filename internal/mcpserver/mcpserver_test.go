package mcpserver_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/faultproxy"
	"github.com/quillhq/quill/internal/mcpserver"
)

type testBundle struct {
	t       *testing.T
	api     *apitest.API
	proxy   *faultproxy.Proxy
	front   string
	journal string
	server  *mcpserver.Server
	session *mcp.ClientSession
}

// setup runs the MCP server over a client of a real API behind a
// response-dropping proxy, and connects an in-memory MCP client to it.
func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{t: t, api: apitest.Start(t), journal: t.TempDir()}
	b.proxy, b.front = b.api.Proxy(t, faultproxy.Config{})
	b.connect()
	return b
}

// connect starts an MCP server (a new process, as far as the journal
// goes) over the bundle's journal directory, without its start-up resume,
// and connects a new MCP client to it.
func (b *testBundle) connect() {
	t := b.t
	t.Helper()
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	c, err := client.New(client.Config{BaseURL: b.front, Token: b.api.Token, Journal: j, Attempts: 2,
		Deadline: 3 * time.Second, BaseDelay: 5 * time.Millisecond})
	require.NoError(t, err)

	ctx := t.Context()
	st, ct := mcp.NewInMemoryTransports()
	b.server = mcpserver.New(c, mcpserver.Config{Version: "test"})
	ss, err := b.server.MCP().Connect(ctx, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ss.Close() })
	b.session, err = mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.session.Close() })
}

func (b *testBundle) call(name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	b.t.Helper()
	res, err := b.session.CallTool(b.t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(b.t, err)
	raw, err := json.Marshal(res.StructuredContent)
	require.NoError(b.t, err)
	var m map[string]any
	require.NoError(b.t, json.Unmarshal(raw, &m), "structured content: %s", raw)
	return res, m
}

func textOf(res *mcp.CallToolResult) string {
	var sb strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			sb.WriteString(t.Text)
		}
	}
	return sb.String()
}

func TestToolsAreListed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.session.ListTools(t.Context(), nil)
	require.NoError(t, err)
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	require.ElementsMatch(t, []string{"create_note", "update_note", "delete_note", "get_note", "get_operation", "list_operations", "list_webhooks", "get_webhook"}, names)
}

func TestCreateGetDeleteLookup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, out := b.call("create_note", map[string]any{"title": "from an agent", "body": "b",
		"attachment": map[string]any{"filename": "a.txt", "content_type": "text/plain", "data": base64.StdEncoding.EncodeToString([]byte("hi\n"))}})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	key := out["operation_key"].(string)
	require.NotEmpty(t, key)
	id := out["note"].(map[string]any)["id"].(string)

	res, out = b.call("get_note", map[string]any{"id": id})
	require.False(t, res.IsError)
	require.Equal(t, "from an agent", out["title"])

	res, out = b.call("get_operation", map[string]any{"operation_key": key})
	require.False(t, res.IsError)
	require.Equal(t, "completed", out["state"])
	require.Equal(t, "create-note", out["action"])
	require.EqualValues(t, 201, out["response"].(map[string]any)["status"])

	res, out = b.call("get_operation", map[string]any{"operation_key": "never-used"})
	require.False(t, res.IsError)
	require.Equal(t, map[string]any{"operation_key": "never-used", "state": "not_found"}, out)

	res, out = b.call("delete_note", map[string]any{"id": id, "operation_key": "del-1"})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	require.Equal(t, "del-1", out["operation_key"])

	res, _ = b.call("get_note", map[string]any{"id": id})
	require.True(t, res.IsError)
}

func TestDroppedResponseIsReplayedUnderTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.DropNext(1)
	res, out := b.call("create_note", map[string]any{"title": "dropped", "operation_key": "agent-op-1"})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	require.Equal(t, "agent-op-1", out["operation_key"])
	require.Equal(t, true, out["replayed"])
	require.Equal(t, 1, b.api.Notes(t, "dropped"))
}

func TestUnknownOutcomeTellsTheModelToLookUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.proxy.SetDropProbability(1))
	res, out := b.call("create_note", map[string]any{"title": "maybe"})
	require.False(t, res.IsError, "an unknown outcome is not an error result")
	require.Equal(t, "unknown", out["state"])
	key := out["operation_key"].(string)
	require.NotEmpty(t, key)
	text := textOf(res)
	require.Contains(t, text, "get_operation")
	require.Contains(t, text, key)
	require.Contains(t, text, "Do NOT call create_note again")

	// The model does as told.
	require.NoError(t, b.proxy.SetDropProbability(0))
	res, out = b.call("get_operation", map[string]any{"operation_key": key})
	require.False(t, res.IsError)
	require.Equal(t, "completed", out["state"])
	require.Equal(t, 1, b.api.Notes(t, "maybe"))
}

func TestRefusedIsAnErrorResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, out := b.call("create_note", map[string]any{"title": "one", "operation_key": "k-reused"})
	require.Equal(t, "completed", out["state"])
	res, out := b.call("create_note", map[string]any{"title": "two", "operation_key": "k-reused"})
	require.True(t, res.IsError)
	require.Equal(t, "refused", out["state"])
	require.Equal(t, "idempotency_key_reused", out["error"].(map[string]any)["code"])
	require.Contains(t, textOf(res), "new request needs a new key")

	res, out = b.call("create_note", map[string]any{"title": ""})
	require.True(t, res.IsError)
	require.Equal(t, "refused", out["state"])
	require.Equal(t, "validation_failed", out["error"].(map[string]any)["code"])
}

func TestRateLimitedIsARetryableErrorWithTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var limit atomic.Bool
	limit.Store(true)
	b.api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && limit.Load() {
				w.Header().Set("Content-Type", "application/problem+json")
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprint(w, `{"type":"urn:quill:problem:rate_limited","title":"Too Many Requests","status":429,`+
					`"detail":"past QUILL_TENANT_CONCURRENCY","code":"rate_limited","retry":"same_key"}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	res, out := b.call("create_note", map[string]any{"title": "busy"})
	require.True(t, res.IsError, "the call did not do its work")
	require.Equal(t, "unknown", out["state"])
	key := out["operation_key"].(string)
	e := out["error"].(map[string]any)
	require.Equal(t, "rate_limited", e["code"])
	require.Equal(t, "same_key", e["retry"])
	require.EqualValues(t, 1, e["retry_after_seconds"])
	text := textOf(res)
	require.Contains(t, text, "SAME operation_key")
	require.Contains(t, text, key)
	require.Contains(t, text, "Wait 1s")

	// The model does as told.
	limit.Store(false)
	res, out = b.call("create_note", map[string]any{"title": "busy", "operation_key": key})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	require.Equal(t, 1, b.api.Notes(t, "busy"))
}
