package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/problem"
	"github.com/quillhq/quill/internal/webhooks"
)

// The webhook endpoints' routes (SPEC §11).
const (
	webhooksPattern      = contract.WebhooksPath
	webhookPattern       = contract.WebhooksPath + "/{id}"
	webhookRotatePattern = webhookPattern + "/rotate-secret"
)

// webhooksReady answers 503 webhooks_not_configured, and reports false,
// when the deployment has no QUILL_WEBHOOK_SECRET_KEY: checked before
// anything else of the request, which nothing it holds could change.
func (s *server) webhooksReady(w http.ResponseWriter, r *http.Request) bool {
	if s.Webhooks != nil && s.Webhooks.Configured() {
		return true
	}
	writeError(w, r, webhooks.ErrNotConfigured)
	return false
}

func (s *server) webhookRequest(r *http.Request, key string) webhooks.Request {
	return webhooks.Request{Tenant: info(r).tenant, Key: key, Wait: preferWait(r),
		RenderError: func(err error) []byte { return problemFor(err).JSON() }}
}

func (s *server) createWebhook(w http.ResponseWriter, r *http.Request) {
	if !s.webhooksReady(w, r) {
		return
	}
	key, p := operationKey(r, contract.ActionCreateWebhook)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	var in webhooks.CreateInput
	if p := decodeBody(w, r, s.Config.MaxBodyBytes, &in); p != nil {
		writeProblem(w, r, p)
		return
	}
	params, err := s.Webhooks.ValidateCreate(in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	out, err := s.Webhooks.Create(r.Context(), s.webhookRequest(r, key), params)
	writeOutcome(w, r, out, err)
}

// webhookWrite reads what a write on one endpoint takes: the operation key,
// an empty body or none, and the path's id.
func (s *server) webhookWrite(w http.ResponseWriter, r *http.Request, action string) (string, uuid.UUID, bool) {
	if !s.webhooksReady(w, r) {
		return "", uuid.Nil, false
	}
	key, p := operationKey(r, action)
	if p != nil {
		writeProblem(w, r, p)
		return "", uuid.Nil, false
	}
	if r.ContentLength != 0 {
		// It takes no parameters; a body may only be an empty object.
		var empty struct{}
		if p := decodeBody(w, r, s.Config.MaxBodyBytes, &empty); p != nil {
			writeProblem(w, r, p)
			return "", uuid.Nil, false
		}
	}
	id, ok := parseID(r)
	if !ok {
		writeError(w, r, webhooks.ErrNotFound)
		return "", uuid.Nil, false
	}
	return key, id, true
}

func (s *server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	key, id, ok := s.webhookWrite(w, r, contract.ActionDeleteWebhook)
	if !ok {
		return
	}
	out, err := s.Webhooks.Delete(r.Context(), s.webhookRequest(r, key), id)
	writeOutcome(w, r, out, err)
}

func (s *server) rotateWebhookSecret(w http.ResponseWriter, r *http.Request) {
	key, id, ok := s.webhookWrite(w, r, contract.ActionRotateWebhookSecret)
	if !ok {
		return
	}
	out, err := s.Webhooks.RotateSecret(r.Context(), s.webhookRequest(r, key), id)
	writeOutcome(w, r, out, err)
}

// webhookView is an endpoint as the reads show it: never a secret.
type webhookView struct {
	ID             string     `json:"id"`
	URL            string     `json:"url"`
	EventTypes     []string   `json:"event_types"`
	Description    string     `json:"description"`
	CreatedAt      string     `json:"created_at"`
	State          string     `json:"state"`
	DisabledReason *string    `json:"disabled_reason,omitzero"`
	Health         healthView `json:"health"`
}

// healthView is an endpoint's health; null where nothing is known yet.
type healthView struct {
	LastAttemptAt  *string `json:"last_attempt_at"`
	LastDeliveryAt *string `json:"last_delivery_at"`
	LastStatus     *int32  `json:"last_status"`
	LastError      *string `json:"last_error"`
	FailuresInRow  int32   `json:"failures_in_row"`
	FailingSince   *string `json:"failing_since"`
}

func endpointView(e *webhooks.Endpoint) webhookView {
	h := e.Health
	return webhookView{ID: e.ID.String(), URL: e.URL, EventTypes: e.EventTypes, Description: e.Description,
		CreatedAt: webhooks.FormatTime(e.CreatedAt), State: h.State, DisabledReason: h.DisabledReason,
		Health: healthView{LastAttemptAt: optionalTime(h.LastAttemptAt), LastDeliveryAt: optionalTime(h.LastDeliveryAt),
			LastStatus: h.LastStatus, LastError: h.LastError, FailuresInRow: h.FailuresInRow, FailingSince: optionalTime(h.FailingSince)}}
}

// optionalTime formats t as the API writes times; nil for nil.
func optionalTime(t *time.Time) *string {
	if t == nil {
		return nil
	}
	v := webhooks.FormatTime(*t)
	return &v
}

func (s *server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	if !s.webhooksReady(w, r) {
		return
	}
	list, err := s.Webhooks.List(r.Context(), info(r).tenant)
	if err != nil {
		writeError(w, r, err)
		return
	}
	page := struct {
		Items      []webhookView `json:"items"`
		NextCursor *string       `json:"next_cursor"`
	}{Items: make([]webhookView, 0, len(list))}
	for _, e := range list {
		page.Items = append(page.Items, endpointView(e))
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *server) getWebhook(w http.ResponseWriter, r *http.Request) {
	if !s.webhooksReady(w, r) {
		return
	}
	id, ok := parseID(r)
	if !ok {
		writeError(w, r, webhooks.ErrNotFound)
		return
	}
	e, err := s.Webhooks.Get(r.Context(), info(r).tenant, id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, endpointView(e))
}

// webhookProblem maps the webhooks package's own errors to their problems;
// nil for another error (its validation errors are problemFor's, as
// every domain package's).
func webhookProblem(err error) *problem.Problem {
	var limit *webhooks.LimitError
	switch {
	case errors.As(err, &limit):
		return problem.New(http.StatusUnprocessableEntity, contract.CodeWebhookLimitReached, fmt.Sprintf(
			"this tenant has %d webhook endpoints, the most it may have; nothing was created: delete one (DELETE /v1/webhooks/{id}), then create under a new key", limit.Max))
	case errors.Is(err, webhooks.ErrNotConfigured):
		return problem.New(http.StatusServiceUnavailable, contract.CodeWebhooksNotConfigured,
			"this deployment has no QUILL_WEBHOOK_SECRET_KEY, so webhooks are off; nothing was executed, and retrying changes nothing until an operator sets it")
	case errors.Is(err, webhooks.ErrNotFound):
		return problem.New(http.StatusNotFound, contract.CodeNotFound, "no webhook endpoint with this id exists for this tenant (it may have been deleted)")
	}
	return nil
}
