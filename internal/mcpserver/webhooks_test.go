package mcpserver_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
)

// person is the client a person's quill webhooks would use: the same API
// and tenant as the MCP server's, not through it.
func (b *testBundle) person() *client.Client {
	b.t.Helper()
	c, err := client.New(client.Config{BaseURL: b.api.URL, Token: b.api.Token})
	require.NoError(b.t, err)
	return c
}

// list_webhooks and get_webhook show the endpoints and their health, and
// nothing of a secret; get_operation of a note's create shows the
// deliveries of its event; a missing endpoint is an error result.
func TestWebhookToolsReadWithoutSecrets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, out := b.call("list_webhooks", map[string]any{})
	require.False(t, res.IsError, textOf(res))
	require.Empty(t, out["items"])
	require.Contains(t, textOf(res), "No webhook endpoints")

	created, err := b.person().CreateWebhook(t.Context(), client.NewWebhook{URL: "https://hooks.example.com/agent",
		EventTypes: []string{contract.CloudEventType(contract.EventNoteCreated)}}, client.WithKey("person-hook"))
	require.NoError(t, err)
	id := created.Webhook.ID

	res, out = b.call("list_webhooks", map[string]any{})
	require.False(t, res.IsError, textOf(res))
	items := out["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, id, items[0].(map[string]any)["id"])
	require.Equal(t, "active", items[0].(map[string]any)["state"])
	require.Contains(t, textOf(res), id+" https://hooks.example.com/agent (active)")

	res, out = b.call("get_webhook", map[string]any{"id": id})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "https://hooks.example.com/agent", out["url"])
	require.EqualValues(t, 0, out["health"].(map[string]any)["failures_in_row"])

	// The person's create, looked up by the model: its recorded answer
	// shows the secret as null.
	res, out = b.call("get_operation", map[string]any{"operation_key": "person-hook"})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "create-webhook", out["action"])
	body := out["response"].(map[string]any)["body"].(map[string]any)
	require.Contains(t, body, "secret")
	require.Nil(t, body["secret"])

	// A note's lookup lists the deliveries of its event as webhook
	// effects (the dispatcher's row, written as it would).
	res, _ = b.call("create_note", map[string]any{"title": "hooked", "operation_key": "agent-note"})
	require.False(t, res.IsError, textOf(res))
	_, err = b.api.Pool.Exec(t.Context(), `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, attempts, last_status)
		SELECT tenant, $2, id, 'quill.note.created.v1', '{}', now(), 'failed', 7, 500 FROM outbox_events WHERE tenant = $1 AND operation_key = 'agent-note'`,
		b.api.Tenant, id)
	require.NoError(t, err)
	res, out = b.call("get_operation", map[string]any{"operation_key": "agent-note"})
	require.False(t, res.IsError, textOf(res))
	var hooks []map[string]any
	for _, e := range out["effects"].([]any) {
		if m := e.(map[string]any); m["kind"] == "webhook" {
			hooks = append(hooks, m)
		}
	}
	require.Len(t, hooks, 1)
	require.Equal(t, id, hooks[0]["endpoint_id"])
	require.Equal(t, "failed", hooks[0]["state"])
	require.EqualValues(t, 7, hooks[0]["attempts"])
	require.EqualValues(t, 500, hooks[0]["last_status"])

	res, out = b.call("get_webhook", map[string]any{"id": "0193aaaa-0000-7000-8000-000000000001"})
	require.True(t, res.IsError)
	require.Equal(t, "not_found", out["error"].(map[string]any)["code"])

	// Nothing any tool answered holds the secret, nor its base64.
	for _, call := range []struct {
		name string
		args map[string]any
	}{{"list_webhooks", map[string]any{}}, {"get_webhook", map[string]any{"id": id}}, {"get_operation", map[string]any{"operation_key": "person-hook"}}} {
		res, out := b.call(call.name, call.args)
		raw, err := json.Marshal(out)
		require.NoError(t, err)
		for _, s := range []string{created.Secret, strings.TrimPrefix(created.Secret, "whsec_")} {
			require.NotContains(t, string(raw), s, call.name)
			require.NotContains(t, textOf(res), s, call.name)
		}
	}
}

// The server has no webhook write tool, and leaves a webhook write that
// quill journalled unsettled — neither resumed (its answer carries the
// secret, for the person) nor offered by list_operations (no tool could
// finish it).
func TestWebhookWritesAreLeftToQuill(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	_, err = j.Begin(t.Context(), client.JournalEntry{Key: "quill-hook", Action: contract.ActionCreateWebhook,
		Params: []byte(`{"url":"https://hooks.example.com/q","event_types":["quill.note.created.v1"]}`), CreatedAt: time.Now().UTC()})
	require.NoError(t, err)

	res, out := b.call("list_operations", map[string]any{})
	require.False(t, res.IsError)
	require.Empty(t, out["operations"])
	require.Contains(t, textOf(res), "No unfinished writes")

	b.server.Resume(t.Context())
	e, err := j.Get(t.Context(), "quill-hook")
	require.NoError(t, err)
	require.Nil(t, e.Settled, "left for quill ops resume")
	hooks, err := b.person().ListWebhooks(t.Context())
	require.NoError(t, err)
	require.Empty(t, hooks, "nothing was sent")

	tools, err := b.session.ListTools(t.Context(), nil)
	require.NoError(t, err)
	for _, tool := range tools.Tools {
		if strings.Contains(tool.Name, "webhook") {
			require.True(t, tool.Annotations.ReadOnlyHint, tool.Name)
		}
	}
}
