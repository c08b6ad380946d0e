package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/wait"
	"github.com/quillhq/quill/internal/webhooktest"
)

// dispatcherConsumer is the dispatcher's durable consumer (its default).
const dispatcherConsumer = "webhook-dispatcher"

// startDispatcher runs a webhook-dispatcher under the suite's supervisor
// (restarted whenever it ends, killed on request), with the run's
// QUILL_WEBHOOK_SECRET_KEY, loopback receivers allowed and extra settings,
// and waits until it is healthy. Its log is printed when t fails.
func startDispatcher(t *testing.T, s *system, name string, extra ...string) *daemon {
	t.Helper()
	adminAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	env := slices.Concat(s.common, []string{"DATABASE_URL=" + s.dbURL, "QUILL_ADMIN_ADDR=" + adminAddr,
		"QUILL_WEBHOOK_ALLOW_PRIVATE=true", "QUILL_ACK_WAIT=5s"}, extra)
	d := newDaemon(name, s.bins.dispatcher, adminAddr, filepath.Join(s.dir, name+".log"), env, "run")
	d.role = "webhook-dispatcher"
	go d.Run()
	t.Cleanup(func() {
		_ = d.Stop(40 * time.Second)
		if t.Failed() {
			t.Logf("--- %s log, warnings and errors (first 30):\n%s", d.name,
				strings.Join(grepFile(d.logFile, 30, `"level":"error"`, `"level":"warn"`, "panic", "=== e2e"), "\n"))
			t.Logf("--- %s log, last 20 lines:\n%s", d.name, tail(d.logFile, 20))
		}
	})
	require.NoError(t, d.WaitHealthy(t.Context(), 90*time.Second))
	return d
}

// hookEndpoint is a registered endpoint as its creation answered.
type hookEndpoint struct {
	ID     string `json:"id"`
	URL    string `json:"url"`
	Secret string `json:"secret"`
}

// createWebhook registers url for types through the API.
func (c *editClient) createWebhook(key, url string, types ...string) hookEndpoint {
	c.t.Helper()
	a := c.do(http.MethodPost, "/v1/webhooks", key, 0, map[string]any{"url": url, "event_types": types, "description": "e2e " + key})
	require.Equal(c.t, http.StatusCreated, a.status, "POST /v1/webhooks: %s", a.body)
	var e hookEndpoint
	require.NoError(c.t, json.Unmarshal(a.body, &e))
	require.True(c.t, strings.HasPrefix(e.Secret, "whsec_"), "the secret, shown once: %s", a.body)
	return e
}

// rotateWebhook rotates the endpoint's secret and returns the new one.
func (c *editClient) rotateWebhook(key, id string) string {
	c.t.Helper()
	a := c.do(http.MethodPost, "/v1/webhooks/"+id+"/rotate-secret", key, 0, nil)
	require.Equal(c.t, http.StatusOK, a.status, "rotate-secret: %s", a.body)
	var r struct {
		Secret string `json:"secret"`
	}
	require.NoError(c.t, json.Unmarshal(a.body, &r))
	require.True(c.t, strings.HasPrefix(r.Secret, "whsec_"), "%s", a.body)
	return r.Secret
}

// hookEffect is an effect of a lookup, of any kind, with the fields a
// webhook delivery's has (SPEC §11).
type hookEffect struct {
	Kind       string `json:"kind"`
	ID         string `json:"id"`
	Type       string `json:"type"`
	State      string `json:"state"`
	EndpointID string `json:"endpoint_id"`
	EventID    string `json:"event_id"`
	Attempts   int    `json:"attempts"`
	LastStatus *int   `json:"last_status"`
}

func (c *editClient) hookLookup(key string) []hookEffect {
	c.t.Helper()
	a := c.do(http.MethodGet, "/v1/operations/"+key, "", 0, nil)
	require.Equal(c.t, http.StatusOK, a.status, "lookup %s: %s", key, a.body)
	var l struct {
		Effects []hookEffect `json:"effects"`
	}
	require.NoError(c.t, json.Unmarshal(a.body, &l))
	return l.Effects
}

// outboxEvent is an event as the outbox holds it.
type outboxEvent struct {
	ID, Tenant, Type, NoteID, Key string
}

func readOutbox(ctx context.Context, dbURL string) ([]outboxEvent, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT id::text, tenant, type, aggregate_id::text, coalesce(operation_key, '') FROM outbox_events ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxEvent, error) {
		var e outboxEvent
		err := r.Scan(&e.ID, &e.Tenant, &e.Type, &e.NoteID, &e.Key)
		return e, err
	})
}

// deliveryRow is a row of webhook_deliveries.
type deliveryRow struct {
	EndpointID, EventID, Type, State string
	Attempts                         int
	LastStatus                       *int
}

func readDeliveries(ctx context.Context, dbURL string) ([]deliveryRow, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT endpoint_id::text, event_id::text, event_type, state, attempts, last_status FROM webhook_deliveries ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (deliveryRow, error) {
		var d deliveryRow
		err := r.Scan(&d.EndpointID, &d.EventID, &d.Type, &d.State, &d.Attempts, &d.LastStatus)
		return d, err
	})
}

// settleWebhooks waits until the attachment of every live note is
// processed (the worker writes its attachment.processed event then; a
// deleted note's is skipped), every event is published,
// the dispatcher's consumer has recorded every one (nothing pending or
// unacknowledged) and no delivery is pending; it fails t after timeout.
func settleWebhooks(t *testing.T, s *system, timeout time.Duration) {
	t.Helper()
	ctx := t.Context()
	nc, js, err := jetStreamAt(s.natsURL, "e2e-webhook-settle", nats.MaxReconnects(-1))
	require.NoError(t, err)
	defer nc.Close()
	conn, err := pgx.Connect(ctx, s.dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(timeout)
	lastLog := time.Now()
	for {
		var unpublished, pending, attachments int64
		err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events WHERE published_at IS NULL),
			(SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),
			(SELECT count(*) FROM attachments a JOIN notes n ON n.id = a.note_id WHERE a.status = 'pending' AND n.deleted_at IS NULL)`).Scan(&unpublished, &pending, &attachments)
		require.NoError(t, err)
		var consPending, ackPending uint64 = 1, 1
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if c, err := js.Consumer(cctx, streamName, dispatcherConsumer); err == nil {
			if ci, err := c.Info(cctx); err == nil {
				consPending, ackPending = ci.NumPending, uint64(ci.NumAckPending)
			}
		}
		cancel()
		state := fmt.Sprintf("%d attachments pending, %d unpublished events, dispatcher consumer pending %d, unacknowledged %d, %d pending deliveries",
			attachments, unpublished, consPending, ackPending, pending)
		if attachments == 0 && unpublished == 0 && consPending == 0 && ackPending == 0 && pending == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "webhooks not settled within %s: %s", timeout, state)
		if time.Since(lastLog) > 10*time.Second {
			t.Logf("settling: %s", state)
			lastLog = time.Now()
		}
		wait.For(ctx, 200*time.Millisecond)
	}
}

// receivedEvent is a delivery the receiver accepted, its body read as the
// CloudEvent it is.
type receivedEvent struct {
	webhooktest.Event
	Type, NoteID string
	Version      int
}

func received(t *testing.T, r *webhooktest.Receiver) []receivedEvent {
	t.Helper()
	var out []receivedEvent
	for _, e := range r.Events(t) {
		var ce struct {
			ID, Type, Subject string
			Data              struct {
				Version int `json:"version"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(e.Body, &ce), "a delivery's body is a CloudEvent: %s", e.Body)
		require.Equal(t, e.ID, ce.ID, "webhook-id is the CloudEvent's id")
		out = append(out, receivedEvent{Event: e, Type: ce.Type, NoteID: ce.Subject, Version: ce.Data.Version})
	}
	return out
}

// TestWebhookDeliveries runs the real programs with a webhook dispatcher
// and a receiver that verifies with the Standard Webhooks project's npm
// package (internal/webhooktest). Tenant e2e-a registers two endpoints
// through the API — one for note.created and note.updated, one for
// note.deleted — and creates, updates and deletes notes (some with an
// attachment, whose attachment.processed nobody subscribed to); tenant
// e2e-b writes too. Half-way, the first endpoint's secret is rotated and
// the receiver keeps only the new one. Then: every delivery verified (none
// refused); the webhook-ids each path received are exactly the ids of the
// outbox's and the stream's events of e2e-a of the endpoint's types; a
// note's events arrived in version order; nothing else was sent; each
// operation's lookup lists one webhook effect per delivery, delivered with
// 200; every delivery row is delivered.
func TestWebhookDeliveries(t *testing.T) {
	// Not parallel: see TestDemo.
	if testing.Short() {
		t.Skip("e2e: runs the real programs; skipped with -short")
	}
	seed := randomSeed()
	run := fmt.Sprintf("hooks%08x", uint32(seed))
	s := setup(t, profile{Name: "webhooks"}, seed, run, topology{APIs: 1, Relays: 1, Workers: 1})
	startDispatcher(t, s, "webhook-dispatcher", "QUILL_WEBHOOK_TIMEOUT=5s", "QUILL_WEBHOOK_BACKOFF_MIN=200ms", "QUILL_WEBHOOK_BACKOFF_MAX=2s")
	rcv := webhooktest.Start(t)
	a := &editClient{t: t, base: s.apiURL, token: s.tenants[0].Token}
	b := &editClient{t: t, base: s.apiURL, token: s.tenants[1].Token}

	changes := a.createWebhook(run+"-hook1", rcv.URL+"/changes", "quill.note.created.v1", "quill.note.updated.v1")
	deletes := a.createWebhook(run+"-hook2", rcv.URL+"/deletes", "quill.note.deleted.v1")
	rcv.SetSecrets(t, changes.Secret, deletes.Secret)

	// keys are e2e-a's operations, to look up at the end.
	var keys []string
	// edit creates n notes (the last with a text attachment: one not
	// deleted, since the worker skips a deleted note's), updates each
	// twice under If-Match and deletes the first del < n of them.
	edit := func(c *editClient, phase string, n, del int) {
		for i := range n {
			key := fmt.Sprintf("%s-%s-n%d", run, phase, i)
			body := map[string]any{"title": fmt.Sprintf("%s note %d", phase, i)}
			if i == n-1 {
				body["attachment"] = map[string]string{"filename": "n.txt", "content_type": "text/plain",
					"data": base64.StdEncoding.EncodeToString([]byte("one line\ntwo words\n"))}
			}
			created := c.do(http.MethodPost, "/v1/notes", key+"-c", 0, body)
			require.Equal(t, http.StatusCreated, created.status, "%s", created.body)
			id := created.note(t).ID
			ops := []string{key + "-c"}
			for v := 1; v <= 2; v++ {
				u := c.do(http.MethodPatch, "/v1/notes/"+id, fmt.Sprintf("%s-u%d", key, v), v, map[string]any{"body": fmt.Sprintf("v%d", v+1)})
				require.Equal(t, http.StatusOK, u.status, "%s", u.body)
				ops = append(ops, fmt.Sprintf("%s-u%d", key, v))
			}
			if i < del {
				d := c.do(http.MethodDelete, "/v1/notes/"+id, key+"-d", 3, nil)
				require.Equal(t, http.StatusOK, d.status, "%s", d.body)
				ops = append(ops, key+"-d")
			}
			if c == a {
				keys = append(keys, ops...)
			}
		}
	}
	edit(a, "before", 4, 2)
	edit(b, "other", 2, 1)
	settleWebhooks(t, s, 90*time.Second)
	before := map[string]bool{}
	for _, e := range rcv.Events(t) {
		before[e.ID] = true
	}
	require.NotEmpty(t, before)

	// The rotation: from now on the receiver verifies the first
	// endpoint's deliveries with the new secret alone.
	rotated := a.rotateWebhook(run+"-rotate", changes.ID)
	require.NotEqual(t, changes.Secret, rotated)
	rcv.SetSecrets(t, rotated, deletes.Secret)
	edit(a, "after", 3, 1)
	settleWebhooks(t, s, 90*time.Second)

	st := rcv.Stats(t)
	t.Logf("receiver: accepted %d, duplicates %d, rejected %d, bad requests %d", st.Accepted, st.Duplicates, st.Rejected, st.BadRequests)
	require.Zero(t, st.Rejected, "every delivery verified with the Standard Webhooks library (after the rotation with the new secret alone)")
	require.Zero(t, st.BadRequests)

	// What should have been sent: e2e-a's events of each endpoint's types,
	// as the outbox and the stream hold them.
	outbox, err := readOutbox(t.Context(), s.dbURL)
	require.NoError(t, err)
	msgs, err := readStream(t.Context(), s.natsURL, streamName)
	require.NoError(t, err)
	inStream := map[string]streamMsg{}
	for _, m := range msgs {
		inStream[m.ID] = m
	}
	want := map[string][]string{"/changes": nil, "/deletes": nil}
	tenantOf := map[string]string{}
	types := map[string]int{}
	for _, e := range outbox {
		tenantOf[e.ID] = e.Tenant
		m, ok := inStream[e.ID]
		require.True(t, ok, "outbox event %s (%s) is in the stream", e.ID, e.Type)
		if e.Tenant != s.tenants[0].Name {
			continue
		}
		types[m.Type]++
		switch m.Type {
		case "quill.note.created.v1", "quill.note.updated.v1":
			want["/changes"] = append(want["/changes"], e.ID)
		case "quill.note.deleted.v1":
			want["/deletes"] = append(want["/deletes"], e.ID)
		}
	}
	require.Positive(t, types["quill.attachment.processed.v1"], "an event of a type nobody subscribed to: %v", types)
	got := map[string][]string{}
	byNote := map[string][]int{}
	var after int
	for _, e := range received(t, rcv) {
		got[e.Path] = append(got[e.Path], e.ID)
		require.Equal(t, s.tenants[0].Name, tenantOf[e.ID], "only e2e-a's events reach e2e-a's endpoints")
		if e.Path == "/changes" {
			byNote[e.NoteID] = append(byNote[e.NoteID], e.Version)
		}
		if !before[e.ID] && e.Path == "/changes" {
			after++
		}
	}
	for path, ids := range want {
		require.ElementsMatch(t, ids, got[path], "%s: the webhook-ids received are the events of its types, once each", path)
	}
	require.Len(t, got, 2, "nothing was sent to another path: %v", got)
	require.Equal(t, len(want["/changes"])+len(want["/deletes"]), st.Accepted)
	require.Equal(t, 3*3, after, "the deliveries after the rotation, verified with the new secret alone")
	for note, versions := range byNote {
		require.True(t, slices.IsSorted(versions), "note %s: its events arrived in version order: %v", note, versions)
		require.Equal(t, []int{1, 2, 3}, versions, "note %s", note)
	}

	// The lookups: each delivery of an operation's events is a webhook
	// effect, delivered.
	endpointOf := map[string]string{"/changes": changes.ID, "/deletes": deletes.ID}
	wantEndpoint := map[string]string{}
	for path, ids := range want {
		for _, id := range ids {
			wantEndpoint[id] = endpointOf[path]
		}
	}
	var hooks int
	for _, key := range keys {
		effects := a.hookLookup(key)
		events := map[string]hookEffect{}
		var webhook []hookEffect
		for _, e := range effects {
			switch e.Kind {
			case "event":
				events[e.ID] = e
			case "webhook":
				webhook = append(webhook, e)
			}
		}
		var wantHere []string
		for id := range events {
			if wantEndpoint[id] != "" {
				wantHere = append(wantHere, id)
			}
		}
		var gotHere []string
		for _, w := range webhook {
			gotHere = append(gotHere, w.EventID)
			require.Equal(t, wantEndpoint[w.EventID], w.EndpointID, "%s: the delivery of %s went to the endpoint of its type", key, w.EventID)
			require.Equal(t, "delivered", w.State, "%s: %+v", key, w)
			require.GreaterOrEqual(t, w.Attempts, 1, "%s: %+v", key, w)
			require.NotNil(t, w.LastStatus, "%s: %+v", key, w)
			require.Equal(t, http.StatusOK, *w.LastStatus, "%s", key)
		}
		require.ElementsMatch(t, wantHere, gotHere, "%s: one webhook effect per delivery of its events: %+v", key, effects)
		hooks += len(webhook)
	}
	require.Equal(t, st.Accepted, hooks, "the lookups list every delivery")

	rows, err := readDeliveries(t.Context(), s.dbURL)
	require.NoError(t, err)
	require.Len(t, rows, st.Accepted, "one delivery row per event and endpoint")
	for _, r := range rows {
		require.Equal(t, "delivered", r.State, "%+v", r)
	}
	t.Logf("%d deliveries to 2 endpoints (%d after the rotation), every one verified and delivered; event types of e2e-a: %v",
		st.Accepted, after, types)
}
