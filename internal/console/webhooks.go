package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dispatch"
)

// The Webhooks page (issue 27): the webhook dispatcher's disabled endpoints
// and failed deliveries, and the three actions of its commands — re-send
// one failed delivery ("webhook-dispatcher deliveries retry ID"), re-send
// an endpoint's failed deliveries ("deliveries retry --failed --endpoint
// ID"), enable a disabled endpoint ("endpoints enable ID") — through the
// same functions of internal/dispatch. The tables are the dispatcher's;
// the console writes them only through those functions.
//
// An id that does not parse is answered 400; one no row has, 404; an
// action on a row in a state it does not apply to (a delivery that is not
// failed, an endpoint that is deleted, an active endpoint to enable), 409.
// Everything tenants chose (URLs) and receivers answered (errors) is
// shown by html/template, escaped.

// webhooksView is the Webhooks page's data.
type webhooksView struct {
	// Endpoint is the endpoint ?endpoint= names, whose failed deliveries
	// alone are listed; nil lists every endpoint's.
	Endpoint *dispatch.Endpoint
	// Disabled is a page of disabled endpoints (without ?endpoint=), from
	// ?disabled_after=; DisabledNext is the next page's cursor ("" on the
	// last).
	Disabled                    []dispatch.Endpoint
	DisabledAfter, DisabledNext string
	// Failed is a page of failed deliveries, newest first, from ?before=;
	// Next is the next page's cursor (0 on the last).
	Failed       []dispatch.Delivery
	Before, Next int64
}

// webhooksQuery is what the Webhooks page was asked for.
type webhooksQuery struct {
	endpoint      *uuid.UUID
	before        int64
	limit         int
	disabledAfter *uuid.UUID
}

// parseWebhooksQuery reads ?endpoint=, ?before=, ?limit= and
// ?disabled_after=, or says what is malformed.
func (c *Console) parseWebhooksQuery(r *http.Request) (webhooksQuery, string) {
	q := r.URL.Query()
	out := webhooksQuery{limit: c.cfg.PageSize}
	if v := q.Get("endpoint"); v != "" {
		id, err := uuid.Parse(v)
		if err != nil {
			return out, "?endpoint= is an endpoint id (a UUID)."
		}
		out.endpoint = &id
	}
	if v := q.Get("disabled_after"); v != "" {
		id, err := uuid.Parse(v)
		if err != nil {
			return out, "?disabled_after= is an endpoint id (a UUID)."
		}
		out.disabledAfter = &id
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return out, "?before= is a delivery id (a non-negative number)."
		}
		out.before = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return out, fmt.Sprintf("?limit= is from 1 to %d.", MaxPageSize)
		}
		out.limit = n
	}
	return out, ""
}

// webhooks lists the disabled endpoints and the failed deliveries, or one
// endpoint and its failed deliveries: each list one statement, a page and
// one probe row more.
func (c *Console) webhooks(w http.ResponseWriter, r *http.Request) {
	q, bad := c.parseWebhooksQuery(r)
	if bad != "" {
		c.fail(w, r, http.StatusBadRequest, bad)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	v := webhooksView{Before: q.before}
	if q.endpoint != nil {
		e, ok := c.webhookEndpoint(ctx, w, r, *q.endpoint)
		if !ok {
			return
		}
		v.Endpoint = &e
	} else {
		disabled, err := dispatch.ListDisabled(ctx, c.pool, dispatch.DisabledQuery{After: q.disabledAfter, Limit: q.limit + 1})
		if err != nil {
			c.failErr(w, r, "list the disabled endpoints", db.Translate(err))
			return
		}
		if q.disabledAfter != nil {
			v.DisabledAfter = q.disabledAfter.String()
		}
		if len(disabled) > q.limit {
			disabled = disabled[:q.limit]
			v.DisabledNext = disabled[q.limit-1].ID.String()
		}
		v.Disabled = disabled
	}
	failed, err := dispatch.ListFailed(ctx, c.pool, dispatch.FailedQuery{Endpoint: q.endpoint, Before: q.before, Limit: q.limit + 1})
	if err != nil {
		c.failErr(w, r, "list the failed deliveries", db.Translate(err))
		return
	}
	if len(failed) > q.limit {
		failed = failed[:q.limit]
		v.Next = failed[q.limit-1].ID
	}
	v.Failed = failed
	c.render(w, r, http.StatusOK, "webhooks", page{Title: "Webhooks", Nav: "webhooks", Data: v, Message: webhooksDone(r)})
}

// webhookEndpoint reads endpoint id, answering 404 when there is none and
// the failure when it cannot be read.
func (c *Console) webhookEndpoint(ctx context.Context, w http.ResponseWriter, r *http.Request, id uuid.UUID) (dispatch.Endpoint, bool) {
	e, err := dispatch.GetEndpoint(ctx, c.pool, id)
	if errors.Is(err, dispatch.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, "Not found: no webhook endpoint has this id.")
		return e, false
	}
	if err != nil {
		c.failErr(w, r, "read the webhook endpoint", db.Translate(err))
		return e, false
	}
	return e, true
}

// webhookConfirmView is the data of a Webhooks action's confirmation page.
type webhookConfirmView struct {
	What   string
	Action string
	Button string
	// Fields are the form's hidden fields: what names the row.
	Fields   map[string]string
	Delivery *dispatch.Delivery
	Endpoint dispatch.Endpoint
	Back     string
}

// webhookAction is one of the page's actions: how its row is named in a
// request, what it checks before it asks or acts, and what it does.
type webhookAction struct {
	// path is below Prefix; name is the action's log name; title heads
	// its confirmation page.
	path, name, title, button string
	// parse reads the row's id from get (the query of the confirmation
	// page, the form of the POST), or says what is malformed.
	parse func(get func(string) string) (webhookTarget, string)
	// refusal says why the action does not apply to the row as it is
	// ("": it applies), answered 409.
	refusal func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string
	// question is what the confirmation page asks.
	question func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string
	// act runs the action and returns the page to go back to; a
	// *dispatch.RefusedRetryError is answered 409, ErrNotFound 404.
	act func(ctx context.Context, c *Console, t webhookTarget, e dispatch.Endpoint, logged func(k, v string)) (string, error)
}

// webhookTarget is the row an action is for: a delivery (and its
// endpoint) or an endpoint.
type webhookTarget struct {
	delivery int64 // 0: the action is an endpoint's
	endpoint uuid.UUID
}

func (t webhookTarget) fields() map[string]string {
	if t.delivery != 0 {
		return map[string]string{"id": strconv.FormatInt(t.delivery, 10)}
	}
	return map[string]string{"endpoint": t.endpoint.String()}
}

func parseDeliveryID(get func(string) string) (webhookTarget, string) {
	id, err := strconv.ParseInt(get("id"), 10, 64)
	if err != nil || id < 1 {
		return webhookTarget{}, "The delivery id is a positive number."
	}
	return webhookTarget{delivery: id}, ""
}

func parseEndpointID(get func(string) string) (webhookTarget, string) {
	id, err := uuid.Parse(get("endpoint"))
	if err != nil {
		return webhookTarget{}, "The endpoint id is a UUID."
	}
	return webhookTarget{endpoint: id}, ""
}

// endpointRefusal is why nothing can be sent to e, or "".
func endpointRefusal(e dispatch.Endpoint) string {
	switch {
	case e.DeletedAt != nil:
		return fmt.Sprintf("Endpoint %s is deleted: nothing is sent to a deleted endpoint.", e.ID)
	case e.State == "disabled":
		return fmt.Sprintf("Endpoint %s is disabled: enable it first (Enable… on its page), then re-send.", e.ID)
	}
	return ""
}

func (c *Console) webhookActions() map[string]webhookAction {
	endpointPage := func(id uuid.UUID, v url.Values) string {
		v.Set("endpoint", id.String())
		return Prefix + "webhooks?" + v.Encode()
	}
	return map[string]webhookAction{
		"retry": {path: "webhooks/retry", name: "retry_webhook_delivery", title: "Re-send a failed delivery", button: "Re-send",
			parse: parseDeliveryID,
			refusal: func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string {
				if d.State != "failed" {
					return fmt.Sprintf("Delivery %d is %s, not failed: there is nothing to re-send.", d.ID, d.State)
				}
				return endpointRefusal(e)
			},
			question: func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string {
				return "Re-send this delivery? It becomes pending again, due now, under the same event id (webhook-id), its attempts and retry horizon starting again (as \"webhook-dispatcher deliveries retry ID\" does)."
			},
			act: func(ctx context.Context, c *Console, t webhookTarget, e dispatch.Endpoint, logged func(k, v string)) (string, error) {
				if err := dispatch.Retry(ctx, c.pool, t.delivery); err != nil {
					return "", err
				}
				return endpointPage(e.ID, url.Values{"resent": {strconv.FormatInt(t.delivery, 10)}}), nil
			}},
		"retry-failed": {path: "webhooks/retry-failed", name: "retry_webhook_failed", title: "Re-send an endpoint's failed deliveries", button: "Re-send all",
			parse: parseEndpointID,
			refusal: func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string {
				if r := endpointRefusal(e); r != "" {
					return r
				}
				if e.Failed == 0 {
					return fmt.Sprintf("Endpoint %s has no failed deliveries: there is nothing to re-send.", e.ID)
				}
				return ""
			},
			question: func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string {
				return fmt.Sprintf("Re-send every failed delivery of this endpoint (%d now)? Each becomes pending again, due now, under its event id (as \"webhook-dispatcher deliveries retry --failed --endpoint ID\" does).", e.Failed)
			},
			act: func(ctx context.Context, c *Console, t webhookTarget, e dispatch.Endpoint, logged func(k, v string)) (string, error) {
				n, skipped, err := dispatch.RetryFailed(ctx, c.pool, &t.endpoint)
				if err != nil {
					return "", err
				}
				logged("retried", strconv.FormatInt(n, 10))
				logged("skipped", strconv.FormatInt(skipped, 10))
				return endpointPage(e.ID, url.Values{"resent_all": {strconv.FormatInt(n, 10)}}), nil
			}},
		"enable": {path: "webhooks/enable", name: "enable_webhook_endpoint", title: "Enable a disabled endpoint", button: "Enable",
			parse: parseEndpointID,
			refusal: func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string {
				switch {
				case e.DeletedAt != nil:
					return fmt.Sprintf("Endpoint %s is deleted: it cannot be enabled.", e.ID)
				case e.State != "disabled":
					return fmt.Sprintf("Endpoint %s is %s, not disabled: there is nothing to enable.", e.ID, e.State)
				}
				return ""
			},
			question: func(t webhookTarget, d *dispatch.Delivery, e dispatch.Endpoint) string {
				return "Enable this endpoint? The dispatcher sends to it again and records deliveries of its new events; its failures in a row are forgotten. Its failed deliveries stay failed until you re-send them (as \"webhook-dispatcher endpoints enable ID\" does)."
			},
			act: func(ctx context.Context, c *Console, t webhookTarget, e dispatch.Endpoint, logged func(k, v string)) (string, error) {
				failed, err := dispatch.Enable(ctx, c.pool, t.endpoint)
				if err != nil {
					return "", err
				}
				return endpointPage(e.ID, url.Values{"enabled": {"1"}, "failed": {strconv.FormatInt(failed, 10)}}), nil
			}},
	}
}

// target reads the action's row from get and then the row itself (the
// delivery and its endpoint, or the endpoint): 400 for an id that does not
// parse, 404 for one no row has.
func (a webhookAction) target(ctx context.Context, c *Console, w http.ResponseWriter, r *http.Request, get func(string) string) (webhookTarget, *dispatch.Delivery, dispatch.Endpoint, bool) {
	t, bad := a.parse(get)
	if bad != "" {
		c.fail(w, r, http.StatusBadRequest, bad)
		return t, nil, dispatch.Endpoint{}, false
	}
	var d *dispatch.Delivery
	if t.delivery != 0 {
		got, err := dispatch.GetDelivery(ctx, c.pool, t.delivery)
		if errors.Is(err, dispatch.ErrNotFound) {
			c.fail(w, r, http.StatusNotFound, "Not found: no webhook delivery has this id.")
			return t, nil, dispatch.Endpoint{}, false
		}
		if err != nil {
			c.failErr(w, r, "read the webhook delivery", db.Translate(err))
			return t, nil, dispatch.Endpoint{}, false
		}
		d = &got
		if t.endpoint, err = uuid.Parse(got.EndpointID); err != nil {
			c.failErr(w, r, "read the webhook delivery", err)
			return t, nil, dispatch.Endpoint{}, false
		}
	}
	e, ok := c.webhookEndpoint(ctx, w, r, t.endpoint)
	return t, d, e, ok
}

// confirm answers the page that asks the operator to confirm the action,
// or 409 when it does not apply to the row as it is.
func (a webhookAction) confirm(c *Console, w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	t, d, e, ok := a.target(ctx, c, w, r, r.URL.Query().Get)
	if !ok {
		return
	}
	if why := a.refusal(t, d, e); why != "" {
		c.fail(w, r, http.StatusConflict, why)
		return
	}
	c.render(w, r, http.StatusOK, "webhookconfirm", page{Title: a.title, Nav: "webhooks", Data: webhookConfirmView{
		What: a.question(t, d, e), Action: Prefix + a.path, Button: a.button, Fields: t.fields(), Delivery: d, Endpoint: e,
		Back: Prefix + "webhooks?endpoint=" + e.ID.String()}})
}

// post runs the action for the signed-in operator and logs it, whatever
// its outcome: 400, 404 and 409 as the confirmation page answers them,
// and 409 too when dispatch refuses it (the row changed in between).
func (a webhookAction) post(c *Console, w http.ResponseWriter, r *http.Request) {
	s, _ := sessionOf(r)
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	logged := c.actionLog(s, a.name)
	if v := r.PostFormValue("id"); v != "" {
		logged = logged.Str("delivery", v)
	}
	if v := r.PostFormValue("endpoint"); v != "" {
		logged = logged.Str("endpoint_id", v)
	}
	t, d, e, ok := a.target(ctx, c, w, r, r.PostFormValue)
	if !ok {
		// Answered already: 400, 404, or the failure to read the row.
		logged.Bool("done", false).Msg("console: webhook action not done: its row was not found or not read")
		return
	}
	if why := a.refusal(t, d, e); why != "" {
		logged.Bool("done", false).Str("refused", why).Msg("console: webhook action refused")
		c.fail(w, r, http.StatusConflict, why)
		return
	}
	back, err := a.act(ctx, c, t, e, func(k, v string) { logged = logged.Str(k, v) })
	var refused *dispatch.RefusedRetryError
	switch {
	case errors.As(err, &refused):
		logged.Bool("done", false).Str("refused", refused.Msg).Msg("console: webhook action refused")
		c.fail(w, r, http.StatusConflict, "Refused: "+refused.Msg+".")
		return
	case errors.Is(err, dispatch.ErrNotFound):
		logged.Bool("done", false).Msg("console: webhook action found no row")
		c.fail(w, r, http.StatusNotFound, "Not found (it may have been deleted in the meantime).")
		return
	case err != nil:
		logged.Bool("done", false).Err(err).Msg("console: webhook action failed")
		c.failErr(w, r, strings.ToLower(a.title), db.Translate(err))
		return
	}
	logged.Bool("done", true).Msg("console: webhook action done")
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// webhooksDone is the line an action's redirect asks for: made from the
// numbers and the id it carries, never a text taken from the URL.
func webhooksDone(r *http.Request) string {
	q := r.URL.Query()
	ep, err := uuid.Parse(q.Get("endpoint"))
	if err != nil {
		return ""
	}
	if id, err := strconv.ParseInt(q.Get("resent"), 10, 64); err == nil {
		return fmt.Sprintf("Delivery %d is pending again, due now; the dispatcher sends it under its event id.", id)
	}
	if n, err := strconv.ParseInt(q.Get("resent_all"), 10, 64); err == nil {
		return fmt.Sprintf("%d failed deliveries of endpoint %s are pending again, due now.", n, ep)
	}
	if n, err := strconv.ParseInt(q.Get("failed"), 10, 64); err == nil && q.Get("enabled") == "1" {
		return fmt.Sprintf("Endpoint %s is enabled; %d failed deliveries to it stay failed until re-sent.", ep, n)
	}
	return ""
}
