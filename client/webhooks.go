package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/quillhq/quill/contract"
)

// Webhook endpoint states (SPEC §11).
const (
	// WebhookActive: deliveries are sent.
	WebhookActive = "active"
	// WebhookDisabled: nothing is sent (failing too long, or answered 410
	// Gone); Webhook.DisabledReason says why.
	WebhookDisabled = "disabled"
)

// Webhook delivery states, the State of an Effect of kind EffectWebhook.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// Effect kinds of the lookup (SPEC §4.6, §11).
const (
	EffectEvent      = "event"
	EffectAttachment = "attachment"
	EffectWebhook    = "webhook"
)

// ErrSecretNotReceived is wrapped by the error of a create or rotation
// that completed — the lookup says so — without its answer reaching the
// client: the answer is the only place the secret is shown (the lookup
// shows it as null), so the write is not done for the caller. Send it again
// under the same key and parameters (Resume does, for a journalled one):
// the server replays its answer, the secret included, while it keeps the
// answer (QUILL_IDEMPOTENCY_RETENTION, 72h by default); after that the
// secret is lost and only a rotation gives the endpoint a known one.
var ErrSecretNotReceived = errors.New("the write completed but the answer carrying its secret was not received")

// Webhook is a webhook endpoint as the reads show it: never its secret.
type Webhook struct {
	ID          string    `json:"id"`
	URL         string    `json:"url"`
	EventTypes  []string  `json:"event_types"`
	Description string    `json:"description"`
	CreatedAt   time.Time `json:"created_at"`
	// State is WebhookActive or WebhookDisabled.
	State string `json:"state"`
	// DisabledReason says why a disabled endpoint is; empty otherwise.
	DisabledReason string `json:"disabled_reason,omitempty"`
	// Health is what the dispatcher recorded of its deliveries (zero in
	// a create's answer).
	Health WebhookHealth `json:"health"`
}

// WebhookHealth is what the dispatcher recorded of an endpoint's
// deliveries; nil where nothing is known yet.
type WebhookHealth struct {
	LastAttemptAt  *time.Time `json:"last_attempt_at"`
	LastDeliveryAt *time.Time `json:"last_delivery_at"`
	// LastStatus is the last attempt's HTTP status; nil for none, or one
	// without an answer (a timeout, a refused connection).
	LastStatus    *int       `json:"last_status"`
	LastError     *string    `json:"last_error"`
	FailuresInRow int        `json:"failures_in_row"`
	FailingSince  *time.Time `json:"failing_since"`
}

// NewWebhook is what CreateWebhook sends.
type NewWebhook struct {
	// URL is an absolute https URL with a public host.
	URL string `json:"url"`
	// EventTypes are CloudEvents types (contract.CloudEventType of
	// contract.EventTypes, quill.note.created.v1 …); at least
	// one, duplicates dropped by the server, order irrelevant.
	EventTypes []string `json:"event_types"`
	// Description is for the tenant's own use, up to 256 bytes; optional.
	Description string `json:"description,omitempty"`
}

// WebhookCreated is CreateWebhook's answer: the endpoint and its signing
// secret, shown here (and in replays of the same operation) only.
type WebhookCreated struct {
	Write
	Webhook Webhook
	// Secret is the signing secret, whsec_ and base64: keep it; no read
	// shows it again.
	Secret string
}

// WebhookSecretRotated is RotateWebhookSecret's answer.
type WebhookSecretRotated struct {
	Write
	ID string
	// Secret is the new signing secret, shown here (and in replays of the
	// same operation) only.
	Secret string
	// PreviousSecretExpiresAt is when the secret it replaced stops
	// signing beside it.
	PreviousSecretExpiresAt time.Time
}

// WebhookDeleted is DeleteWebhook's answer.
type WebhookDeleted struct {
	Write
	Deletion Deletion
}

// createdWebhookBody is a create's answer body.
type createdWebhookBody struct {
	Webhook
	Secret string `json:"secret"`
}

// rotatedBody is a rotation's answer body.
type rotatedBody struct {
	ID                      string    `json:"id"`
	Secret                  string    `json:"secret"`
	PreviousSecretExpiresAt time.Time `json:"previous_secret_expires_at"`
}

// webhookParams are a delete's or rotation's journalled parameters.
type webhookParams struct {
	ID string `json:"id"`
}

// CreateWebhook creates a webhook endpoint as one operation (POST
// /v1/webhooks). The answer carries the endpoint's secret; a retry under
// the same key gets the same secret. It returns a *RefusedError for a final
// refusal (validation, 422 idempotency_key_reused or webhook_limit_reached,
// 503 webhooks_not_configured, ...), an *UnknownOutcomeError when the
// outcome could not be established — wrapping ErrSecretNotReceived when it
// is known to have completed but its secret did not arrive — and
// ErrKeyTooOld or a journal error before sending. A journalled answer is
// recorded without its secret (the journal is on disk).
func (c *Client) CreateWebhook(ctx context.Context, w NewWebhook, opts ...WriteOption) (*WebhookCreated, error) {
	params, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("encode webhook: %w", err)
	}
	var body createdWebhookBody
	wr, err := c.write(ctx, request{action: contract.ActionCreateWebhook, method: http.MethodPost, path: contract.WebhooksPath,
		params: params, body: params, secret: true}, &body, opts)
	if err != nil {
		return nil, err
	}
	return &WebhookCreated{Write: wr, Webhook: body.Webhook, Secret: body.Secret}, nil
}

// RotateWebhookSecret gives endpoint id a new secret as one operation (POST
// /v1/webhooks/{id}/rotate-secret); the one it had keeps signing beside it
// until PreviousSecretExpiresAt. A retry under the same key replays the
// same new secret, never makes another (which would end the first one's
// overlap). No live endpoint with id is a final not_found; the other
// errors are CreateWebhook's.
func (c *Client) RotateWebhookSecret(ctx context.Context, id string, opts ...WriteOption) (*WebhookSecretRotated, error) {
	params, err := json.Marshal(webhookParams{ID: id})
	if err != nil {
		return nil, fmt.Errorf("encode rotation: %w", err)
	}
	var body rotatedBody
	wr, err := c.write(ctx, request{action: contract.ActionRotateWebhookSecret, method: http.MethodPost,
		path: contract.WebhookPath(id) + "/rotate-secret", params: params, secret: true}, &body, opts)
	if err != nil {
		return nil, err
	}
	return &WebhookSecretRotated{Write: wr, ID: body.ID, Secret: body.Secret, PreviousSecretExpiresAt: body.PreviousSecretExpiresAt}, nil
}

// DeleteWebhook deletes endpoint id as one operation (DELETE
// /v1/webhooks/{id}): nothing is delivered to it any more. No live endpoint
// with id is a final not_found; the other errors are CreateNote's.
func (c *Client) DeleteWebhook(ctx context.Context, id string, opts ...WriteOption) (*WebhookDeleted, error) {
	params, err := json.Marshal(webhookParams{ID: id})
	if err != nil {
		return nil, fmt.Errorf("encode delete: %w", err)
	}
	var out WebhookDeleted
	out.Write, err = c.write(ctx, request{action: contract.ActionDeleteWebhook, method: http.MethodDelete,
		path: contract.WebhookPath(id), params: params}, &out.Deletion, opts)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// ListWebhooks returns the tenant's live webhook endpoints with their
// health, oldest first (GET /v1/webhooks; at most 16, one page). A server
// without webhooks answers a *Problem with code webhooks_not_configured.
func (c *Client) ListWebhooks(ctx context.Context) ([]Webhook, error) {
	var page struct {
		Items []Webhook `json:"items"`
	}
	if _, err := c.read(ctx, contract.WebhooksPath, &page); err != nil {
		return nil, err
	}
	if page.Items == nil {
		page.Items = []Webhook{}
	}
	return page.Items, nil
}

// GetWebhook returns endpoint id with its health (GET /v1/webhooks/{id});
// a missing or deleted one is a *Problem with code not_found.
func (c *Client) GetWebhook(ctx context.Context, id string) (*Webhook, error) {
	var w Webhook
	if _, err := c.read(ctx, contract.WebhookPath(id), &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// withoutSecret returns body with its "secret" member null, as the lookup
// shows it: what the journal keeps of an answer that carries a secret. A
// body that is not a JSON object is returned as it is (it holds no
// secret member to remove).
func withoutSecret(body []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return body
	}
	if _, ok := m["secret"]; !ok {
		return body
	}
	m["secret"] = json.RawMessage("null")
	b, err := json.Marshal(m)
	if err != nil {
		return body
	}
	return b
}
