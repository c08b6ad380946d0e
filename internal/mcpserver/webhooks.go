package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
)

// The webhook endpoints reach a model read-only: list_webhooks and
// get_webhook. Their writes answer, or replay, an endpoint's signing
// secret, and a secret in a tool's result is in the model's context — its
// transcript, its provider's logs, whatever it is made to repeat — so
// there is no write tool; a person creates, rotates and deletes endpoints
// with quill webhooks (decision 0085).

// ListWebhooksInput is list_webhooks' arguments (none).
type ListWebhooksInput struct{}

// GetWebhookInput is get_webhook's arguments.
type GetWebhookInput struct {
	ID string `json:"id" jsonschema:"the webhook endpoint's id"`
}

// webhookAction reports whether action is a webhook endpoint's write,
// which this server neither resumes nor lists: it has no tool to finish
// one, and finishing a create or rotation would bring a secret into this
// process for no one (quill ops resume shows it to the person who asked).
func webhookAction(action string) bool {
	switch action {
	case contract.ActionCreateWebhook, contract.ActionDeleteWebhook, contract.ActionRotateWebhookSecret:
		return true
	}
	return false
}

func addWebhookTools(s *mcp.Server, h *handlers) {
	mcp.AddTool(s, &mcp.Tool{
		Name: "list_webhooks",
		Description: "List the tenant's webhook endpoints (the HTTPS URLs Quill POSTs events to), oldest first: id, url, event_types, description, " +
			"state (active or disabled, with disabled_reason) and health (last attempt and delivery, last HTTP status and error, failures in a row). " +
			"Read-only: endpoints are created, rotated and deleted by a person with the quill command (quill webhooks …), never by a tool, because those answers carry the signing secret.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, h.listWebhooks)
	mcp.AddTool(s, &mcp.Tool{
		Name: "get_webhook",
		Description: "Read one webhook endpoint by id with its health: state (active or disabled, with disabled_reason), last_attempt_at, last_delivery_at, " +
			"last_status, last_error, failures_in_row, failing_since. Never its secret. Read-only, as list_webhooks.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, h.getWebhook)
}

// readProblem is the result of a read the server refused, or that got no
// answer.
func readProblem(tool string, err error) (*mcp.CallToolResult, map[string]any, error) {
	var p *client.Problem
	if !errors.As(err, &p) {
		return text(fmt.Sprintf("%s got no answer: %v. Call it again shortly.", tool, err), true),
			map[string]any{"error": map[string]string{"code": "failure", "detail": err.Error()}}, nil
	}
	msg := tool + ": " + p.Error()
	if p.Code == contract.CodeWebhooksNotConfigured {
		msg += ". Webhooks are off on this deployment until its operator sets QUILL_WEBHOOK_SECRET_KEY; calling again changes nothing."
	}
	return text(msg, true), map[string]any{"error": toMap(p)}, nil
}

func (h *handlers) listWebhooks(ctx context.Context, _ *mcp.CallToolRequest, _ ListWebhooksInput) (*mcp.CallToolResult, map[string]any, error) {
	hooks, err := h.c.ListWebhooks(ctx)
	if err != nil {
		return readProblem("list_webhooks", err)
	}
	items := make([]any, 0, len(hooks))
	var sb strings.Builder
	for _, w := range hooks {
		items = append(items, toMap(w))
		fmt.Fprintf(&sb, "\n- %s %s (%s): %s", w.ID, w.URL, w.State, strings.Join(w.EventTypes, ", "))
	}
	msg := "No webhook endpoints."
	if len(hooks) > 0 {
		msg = fmt.Sprintf("%d webhook endpoint(s):%s", len(hooks), sb.String())
	}
	return text(msg, false), map[string]any{"items": items}, nil
}

func (h *handlers) getWebhook(ctx context.Context, _ *mcp.CallToolRequest, in GetWebhookInput) (*mcp.CallToolResult, map[string]any, error) {
	w, err := h.c.GetWebhook(ctx, in.ID)
	if err != nil {
		return readProblem("get_webhook", err)
	}
	return nil, toMap(w), nil
}
