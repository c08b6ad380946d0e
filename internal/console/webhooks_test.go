package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// hookEndpoint inserts a webhook endpoint as the API and the dispatcher
// leave one: health "" (never attempted), "active" (failing) or
// "disabled" (with reason); deleted marks it deleted.
func (h *harness) hookEndpoint(t *testing.T, tenant, u, health, reason string, deleted bool) uuid.UUID {
	t.Helper()
	id := uuid.New()
	ctx := t.Context()
	_, err := h.api.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, tenant, url, event_types, secret_sealed, deleted_at)
		VALUES ($1, $2, $3, '{note.created}', '\x00', CASE WHEN $4 THEN now() END)`, id, tenant, u, deleted)
	require.NoError(t, err)
	switch health {
	case "active":
		_, err = h.api.Pool.Exec(ctx, `INSERT INTO webhook_endpoint_health (endpoint_id, last_attempt_at, last_status, last_error, failures_in_row, failing_since)
			VALUES ($1, now(), 500, 'answered 500', 3, now() - interval '1 hour')`, id)
	case "disabled":
		_, err = h.api.Pool.Exec(ctx, `INSERT INTO webhook_endpoint_health (endpoint_id, state, disabled_at, disabled_reason, last_attempt_at, last_status, last_error, failures_in_row, failing_since)
			VALUES ($1, 'disabled', now(), $2, now(), 410, $2, 9, now() - interval '5 days')`, id, reason)
	}
	require.NoError(t, err)
	return id
}

// hookDeliveries inserts n deliveries to endpoint in state, with lastErr
// and eventType, and returns their ids.
func (h *harness) hookDeliveries(t *testing.T, endpoint uuid.UUID, state string, n int, eventType, lastErr string) []int64 {
	t.Helper()
	rows, err := h.api.Pool.Query(t.Context(), `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, attempts, last_status, last_error, failed_at)
		SELECT e.tenant, e.id, gen_random_uuid(), $4, '{}', now(), $2, 6, 503, $5, CASE WHEN $2 = 'failed' THEN now() END
		FROM webhook_endpoints e, generate_series(1, $3) g WHERE e.id = $1 ORDER BY g RETURNING id`, endpoint, state, n, eventType, lastErr)
	require.NoError(t, err)
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, ids, n)
	return ids
}

func (h *harness) deliveryState(t *testing.T, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, h.api.Pool.QueryRow(t.Context(), `SELECT state FROM webhook_deliveries WHERE id = $1`, id).Scan(&s))
	return s
}

func (h *harness) endpointState(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var s string
	require.NoError(t, h.api.Pool.QueryRow(t.Context(), `SELECT COALESCE((SELECT state FROM webhook_endpoint_health WHERE endpoint_id = $1), 'active')`, id).Scan(&s))
	return s
}

var (
	deliveryRowRE = regexp.MustCompile(`data-delivery="(\d+)"`)
	endpointRowRE = regexp.MustCompile(`<tr data-endpoint="([0-9a-f-]{36})"`)
)

// TestWebhooksPage: the page needs a session and is linked from the
// navigation; it lists the disabled endpoints that are not deleted and
// every failed delivery, nothing else; ?endpoint= shows one endpoint and
// its failed deliveries only; malformed parameters are 400, an unknown
// endpoint 404.
func TestWebhooksPage(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	code, _, hdr := get(t, c, h.srv.URL+"/console/webhooks")
	require.Equal(t, http.StatusSeeOther, code, "no session")
	require.Equal(t, "/console/signin?next="+url.QueryEscape("/console/webhooks"), hdr.Get("Location"))
	_, body := h.signIn(t, c, h.opToken)
	require.Contains(t, body, `<a href="/console/webhooks">Webhooks</a>`, "in the navigation")

	disabled := h.hookEndpoint(t, "acme", "https://a.example/hook", "disabled", "answered 410 Gone", false)
	active := h.hookEndpoint(t, "beta", "https://b.example/hook", "active", "", false)
	gone := h.hookEndpoint(t, "acme", "https://gone.example/hook", "disabled", "answered 410 Gone", true)
	failedDisabled := h.hookDeliveries(t, disabled, "failed", 3, "note.created", "endpoint disabled: answered 410 Gone")
	failedActive := h.hookDeliveries(t, active, "failed", 2, "note.updated", "answered 503")
	pending := h.hookDeliveries(t, active, "pending", 1, "note.created", "")
	delivered := h.hookDeliveries(t, active, "delivered", 1, "note.created", "")

	code, body, _ = get(t, c, h.srv.URL+"/console/webhooks")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `aria-current="page">Webhooks<`)
	var endpoints []string
	for _, m := range endpointRowRE.FindAllStringSubmatch(body, -1) {
		endpoints = append(endpoints, m[1])
	}
	require.Equal(t, []string{disabled.String()}, endpoints, "the disabled endpoint that is not deleted")
	require.Contains(t, body, "https://a.example/hook")
	require.Contains(t, body, "answered 410 Gone")
	require.Contains(t, body, `<td>9</td>`, "failures in a row")
	require.Contains(t, body, `href="/console/webhooks/enable?endpoint=`+disabled.String()+`"`)
	require.NotContains(t, body, gone.String()+`"><code>`, "a deleted endpoint is not listed among the disabled")
	var shown []int64
	for _, m := range deliveryRowRE.FindAllStringSubmatch(body, -1) {
		id, _ := strconv.ParseInt(m[1], 10, 64)
		shown = append(shown, id)
	}
	require.Equal(t, []int64{failedActive[1], failedActive[0], failedDisabled[2], failedDisabled[1], failedDisabled[0]}, shown,
		"every failed delivery, newest first; no pending %d nor delivered %d", pending[0], delivered[0])
	require.Contains(t, body, `href="/console/webhooks/retry?id=`+fmt.Sprint(failedActive[0])+`"`)
	require.Contains(t, body, "answered 503")
	require.Contains(t, body, "note.updated")

	// One endpoint.
	code, body, _ = get(t, c, h.srv.URL+"/console/webhooks?endpoint="+active.String())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<section id="endpoint" data-endpoint="`+active.String()+`" data-state="active">`)
	require.Contains(t, body, "https://b.example/hook")
	require.Contains(t, body, `href="/console/webhooks/retry-failed?endpoint=`+active.String()+`"`)
	require.NotContains(t, body, `id="disabled-endpoints"`)
	require.Len(t, deliveryRowRE.FindAllString(body, -1), 2, "its failed deliveries only")
	code, body, _ = get(t, c, h.srv.URL+"/console/webhooks?endpoint="+gone.String())
	require.Equal(t, http.StatusOK, code, "a deleted endpoint is shown when asked for")
	require.Contains(t, body, `data-state="deleted"`)
	require.NotContains(t, body, "Enable…", "a deleted endpoint cannot be enabled")

	code, body, _ = get(t, c, h.srv.URL+"/console/webhooks?endpoint="+uuid.NewString())
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "no webhook endpoint has this id")
	for _, q := range []string{"endpoint=nope", "before=-1", "before=x", "limit=0", "limit=501", "disabled_after=1"} {
		code, body, _ := get(t, c, h.srv.URL+"/console/webhooks?"+q)
		require.Equal(t, http.StatusBadRequest, code, q)
		require.Contains(t, body, `class="error"`, q)
	}
}

// TestWebhooksPaging: 120 failed deliveries and 7 disabled endpoints page
// from their cursors, each row on one page only.
func TestWebhooksPaging(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	var want []string
	for range 7 {
		want = append(want, h.hookEndpoint(t, "acme", "https://d.example/", "disabled", "gone", false).String())
	}
	ep := uuid.MustParse(want[0])
	all := h.hookDeliveries(t, ep, "failed", 120, "note.created", "boom")

	walk := func(start string, re *regexp.Regexp, list string) (seen []string, pages int) {
		nextRE := regexp.MustCompile(`rel="next" data-list="` + list + `" href="([^"]+)"`)
		for next := start; next != ""; {
			code, body, _ := get(t, c, h.srv.URL+strings.ReplaceAll(next, "&amp;", "&"))
			require.Equal(t, http.StatusOK, code, next)
			pages++
			for _, m := range re.FindAllStringSubmatch(body, -1) {
				require.NotContains(t, seen, m[1], "a row on two pages")
				seen = append(seen, m[1])
			}
			next = ""
			if m := nextRE.FindStringSubmatch(body); m != nil {
				next = m[1] + "&limit=" + regexp.MustCompile(`limit=(\d+)`).FindStringSubmatch(start)[1]
			}
		}
		return seen, pages
	}
	seen, pages := walk("/console/webhooks?limit=25", deliveryRowRE, "failed")
	require.Equal(t, 5, pages)
	require.Len(t, seen, 120)
	require.Equal(t, fmt.Sprint(all[119]), seen[0], "newest first")
	seen, pages = walk("/console/webhooks?limit=3", endpointRowRE, "disabled")
	require.Equal(t, 3, pages)
	require.ElementsMatch(t, want, seen)
	// One endpoint's deliveries page with the endpoint kept.
	seen, pages = walk("/console/webhooks?endpoint="+ep.String()+"&limit=50", deliveryRowRE, "failed")
	require.Equal(t, 3, pages)
	require.Len(t, seen, 120)

	code, body, _ := get(t, c, h.srv.URL+"/console/webhooks")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, deliveryRowRE.FindAllString(body, -1), 50, "the default page size")
}

// postFrom posts form to path from c with extra headers and returns the
// status.
func postFrom(t *testing.T, c *http.Client, u string, form url.Values, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// TestWebhooksActions: re-send one failed delivery, enable a disabled
// endpoint and re-send its failed deliveries, each confirmed first and
// posted from the console — refused from another origin and without a
// session, 409 where it does not apply, 404 for unknown ids, 400 for
// malformed ones — and each logged with the operator.
func TestWebhooksActions(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	disabled := h.hookEndpoint(t, "acme", "https://a.example/hook", "disabled", "answered 410 Gone", false)
	active := h.hookEndpoint(t, "acme", "https://b.example/hook", "active", "", false)
	deleted := h.hookEndpoint(t, "acme", "https://x.example/hook", "", "", true)
	failedDisabled := h.hookDeliveries(t, disabled, "failed", 3, "note.created", "endpoint disabled")
	failedActive := h.hookDeliveries(t, active, "failed", 2, "note.created", "answered 503")
	pending := h.hookDeliveries(t, active, "pending", 1, "note.created", "")[0]
	failedDeleted := h.hookDeliveries(t, deleted, "failed", 1, "note.created", "endpoint deleted")[0]
	id := func(n int64) url.Values { return url.Values{"id": {fmt.Sprint(n)}} }
	ep := func(e uuid.UUID) url.Values { return url.Values{"endpoint": {e.String()}} }
	base := h.srv.URL + "/console/webhooks/"

	// Re-send one: the confirmation names the delivery in its form.
	code, body, _ := get(t, c, base+"retry?id="+fmt.Sprint(failedActive[0]))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<form method="post" action="/console/webhooks/retry" class="confirm">`)
	require.Contains(t, body, fmt.Sprintf(`<input type="hidden" name="id" value="%d">`, failedActive[0]))
	require.Contains(t, body, "https://b.example/hook")

	// Refused before anything is asked: another origin, no session.
	require.Equal(t, http.StatusForbidden, postFrom(t, c, base+"retry", id(failedActive[0]), map[string]string{"Sec-Fetch-Site": "cross-site"}))
	require.Equal(t, http.StatusForbidden, postFrom(t, c, base+"enable", ep(disabled), map[string]string{"Origin": "https://evil.example"}))
	require.Equal(t, http.StatusForbidden, postFrom(t, c, base+"retry-failed", ep(disabled), map[string]string{"Origin": "null"}))
	anon := browser(t)
	code, body, _ = post(t, anon, base+"retry", id(failedActive[0]))
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "Sign in first")
	code, _, _ = get(t, anon, base+"enable?endpoint="+disabled.String())
	require.Equal(t, http.StatusSeeOther, code, "to the sign-in")
	require.Equal(t, "failed", h.deliveryState(t, failedActive[0]), "nothing refused changed anything")
	require.Equal(t, "disabled", h.endpointState(t, disabled))
	require.Contains(t, h.logs.String(), `"error_category":"console_cross_origin"`)

	code, _, hdr := post(t, c, base+"retry", id(failedActive[0]))
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "pending", h.deliveryState(t, failedActive[0]))
	require.Equal(t, "failed", h.deliveryState(t, failedActive[1]), "that one only")
	code, body, _ = get(t, c, h.srv.URL+hdr.Get("Location"))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, fmt.Sprintf("Delivery %d is pending again", failedActive[0]))
	require.Contains(t, h.logs.String(), `"operator":"alice","token_prefix":`)
	require.Regexp(t, fmt.Sprintf(`"console_action":"retry_webhook_delivery","delivery":"%d","done":true`, failedActive[0]), h.logs.String())

	// 409: not failed (pending now, or from the start), or of an endpoint
	// nothing is sent to; 404 unknown; 400 malformed.
	for _, tc := range []struct {
		name string
		form url.Values
		code int
		says string
	}{
		{"re-sent already", id(failedActive[0]), http.StatusConflict, "is pending, not failed"},
		{"pending", id(pending), http.StatusConflict, "is pending, not failed"},
		{"of a disabled endpoint", id(failedDisabled[0]), http.StatusConflict, "is disabled: enable it first"},
		{"of a deleted endpoint", id(failedDeleted), http.StatusConflict, "is deleted"},
		{"unknown", id(failedDeleted + 1000), http.StatusNotFound, "no webhook delivery has this id"},
		{"malformed", url.Values{"id": {"1;DROP"}}, http.StatusBadRequest, "positive number"},
		{"zero", id(0), http.StatusBadRequest, "positive number"},
		{"none", url.Values{}, http.StatusBadRequest, "positive number"},
	} {
		code, body, _ := get(t, c, base+"retry?"+tc.form.Encode())
		require.Equal(t, tc.code, code, "confirm %s", tc.name)
		require.Contains(t, body, tc.says, "confirm %s", tc.name)
		code, body, _ = post(t, c, base+"retry", tc.form)
		require.Equal(t, tc.code, code, "post %s", tc.name)
		require.Contains(t, body, tc.says, "post %s", tc.name)
		require.Contains(t, body, `class="error"`, "the console's error page: %s", tc.name)
	}
	require.Equal(t, "failed", h.deliveryState(t, failedDisabled[0]))
	require.Contains(t, h.logs.String(), `"console_action":"retry_webhook_delivery","delivery":"`+fmt.Sprint(pending)+`","done":false`)

	// Re-send all of a disabled endpoint: 409 until it is enabled.
	code, _, _ = post(t, c, base+"retry-failed", ep(disabled))
	require.Equal(t, http.StatusConflict, code)
	code, body, _ = get(t, c, base+"enable?endpoint="+disabled.String())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<input type="hidden" name="endpoint" value="`+disabled.String()+`">`)
	require.Contains(t, body, "answered 410 Gone")
	code, _, hdr = post(t, c, base+"enable", ep(disabled))
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "active", h.endpointState(t, disabled))
	_, body, _ = get(t, c, h.srv.URL+hdr.Get("Location"))
	require.Contains(t, body, "Endpoint "+disabled.String()+" is enabled; 3 failed deliveries to it stay failed until re-sent.")
	require.Contains(t, body, `data-state="active"`)
	require.Contains(t, h.logs.String(), `"console_action":"enable_webhook_endpoint","endpoint_id":"`+disabled.String()+`","done":true`)
	code, body, _ = post(t, c, base+"enable", ep(disabled))
	require.Equal(t, http.StatusConflict, code, "active now")
	require.Contains(t, body, "is active, not disabled")

	code, body, _ = get(t, c, base+"retry-failed?endpoint="+disabled.String())
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "(3 now)")
	code, _, hdr = post(t, c, base+"retry-failed", ep(disabled))
	require.Equal(t, http.StatusSeeOther, code)
	for _, d := range failedDisabled {
		require.Equal(t, "pending", h.deliveryState(t, d))
	}
	require.Equal(t, "failed", h.deliveryState(t, failedActive[1]), "another endpoint's untouched")
	_, body, _ = get(t, c, h.srv.URL+hdr.Get("Location"))
	require.Contains(t, body, "3 failed deliveries of endpoint "+disabled.String()+" are pending again")
	require.Contains(t, h.logs.String(), `"console_action":"retry_webhook_failed","endpoint_id":"`+disabled.String()+`","retried":"3","skipped":"0","done":true`)
	code, body, _ = post(t, c, base+"retry-failed", ep(disabled))
	require.Equal(t, http.StatusConflict, code, "none failed any more")
	require.Contains(t, body, "has no failed deliveries")

	// Endpoints: 409 for a deleted one, 404 unknown, 400 malformed.
	for _, path := range []string{"enable", "retry-failed"} {
		for _, tc := range []struct {
			form url.Values
			code int
		}{
			{ep(deleted), http.StatusConflict},
			{ep(uuid.New()), http.StatusNotFound},
			{url.Values{"endpoint": {"not-a-uuid"}}, http.StatusBadRequest},
		} {
			code, _, _ := get(t, c, base+path+"?"+tc.form.Encode())
			require.Equal(t, tc.code, code, "confirm %s %v", path, tc.form)
			code, _, _ = post(t, c, base+path, tc.form)
			require.Equal(t, tc.code, code, "post %s %v", path, tc.form)
		}
	}
	require.Equal(t, "failed", h.deliveryState(t, failedDeleted))
}

// TestWebhooksTextEscaped: what tenants chose (a URL, even a tenant name
// the API would refuse) and what receivers answered (errors, reasons) is
// escaped on the list, the endpoint's page and the confirmation pages; the
// line an action's redirect shows is made from ids, never from the URL's
// text.
func TestWebhooksTextEscaped(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	const evil = `"><script>alert(1)</script>`
	e := h.hookEndpoint(t, "t"+evil, "https://x.example/"+evil, "disabled", "reason "+evil, false)
	d := h.hookDeliveries(t, e, "failed", 1, "type"+evil, "error "+evil)[0]
	live := h.hookEndpoint(t, "t"+evil, "javascript:alert(1)//"+evil, "active", "", false)
	h.hookDeliveries(t, live, "failed", 1, "type"+evil, "error "+evil)

	for _, path := range []string{"/console/webhooks", "/console/webhooks?endpoint=" + e.String(), "/console/webhooks?endpoint=" + live.String(),
		"/console/webhooks/enable?endpoint=" + e.String(), "/console/webhooks/retry-failed?endpoint=" + live.String()} {
		code, body, _ := get(t, c, h.srv.URL+path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "<script>alert", path)
		require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;", path)
		require.NotContains(t, body, `href="javascript:`, path)
	}
	code, body, _ := get(t, c, h.srv.URL+"/console/webhooks")
	require.Equal(t, http.StatusOK, code)
	for _, s := range []string{"https://x.example/&#34;&gt;&lt;script&gt;", "reason &#34;&gt;&lt;script&gt;", "error &#34;&gt;&lt;script&gt;", "type&#34;&gt;&lt;script&gt;"} {
		require.Contains(t, body, s)
	}
	// The confirmation of a delivery whose endpoint is disabled is a 409
	// whose text is the console's own.
	code, body, _ = get(t, c, h.srv.URL+"/console/webhooks/retry?id="+fmt.Sprint(d))
	require.Equal(t, http.StatusConflict, code)
	require.NotContains(t, body, "<script>alert")

	for _, q := range []string{"endpoint=" + e.String() + "&resent=" + url.QueryEscape("<script>x</script>"),
		"endpoint=" + e.String() + "&enabled=1&failed=" + url.QueryEscape("<b>x"),
		"endpoint=" + url.QueryEscape("<script>x</script>") + "&resent=1"} {
		code, body, _ := get(t, c, h.srv.URL+"/console/webhooks?"+q)
		require.NotContains(t, body, "<script>x", q)
		require.NotContains(t, body, "<b>x", q)
		if code == http.StatusOK {
			require.NotContains(t, body, `class="message"`, q)
		}
	}
}

// TestWebhooksPageStatements: the Webhooks page is two statements (a page
// of disabled endpoints, a page of failed deliveries), one endpoint's page
// two as well (the endpoint, its failed deliveries): the session costs none
// while its token is trusted.
func TestWebhooksPageStatements(t *testing.T) {
	t.Parallel()
	h, _, tr := countedConsole(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	ep := h.hookEndpoint(t, "acme", "https://a.example/", "disabled", "gone", false)
	h.hookDeliveries(t, ep, "failed", 3, "note.created", "boom")
	for _, path := range []string{"/console/webhooks", "/console/webhooks?endpoint=" + ep.String()} {
		tr.n.Store(0)
		code, _, _ := get(t, c, h.srv.URL+path)
		require.Equal(t, http.StatusOK, code, path)
		require.EqualValues(t, 2, tr.n.Load(), path)
	}
}
