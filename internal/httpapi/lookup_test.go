package httpapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/retention"
)

func TestLookupCompletedOperation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := map[string]any{"title": "Example note", "attachment": map[string]any{"filename": "a.txt", "content_type": "text/plain", "data": b64("hi")}}
	created := b.create(b.tokenA, "op-1", body)
	require.Equal(t, http.StatusCreated, created.status)
	id := created.json(t)["id"].(string)

	l := b.lookup(b.tokenA, "op-1")
	require.Equal(t, http.StatusOK, l.status, "%s", l.body)
	op := l.json(t)
	require.Equal(t, "op-1", op["key"])
	require.Equal(t, "create-note", op["action"])
	require.Equal(t, "completed", op["state"])
	require.NotEmpty(t, op["created_at"])
	require.NotEmpty(t, op["completed_at"])
	exp, err := time.Parse(time.RFC3339, op["expires_at"].(string))
	require.NoError(t, err)
	done, err := time.Parse(time.RFC3339, op["completed_at"].(string))
	require.NoError(t, err)
	require.Equal(t, responseRetention, exp.Sub(done))
	response := op["response"].(map[string]any)
	require.Equal(t, 201.0, response["status"])
	require.Equal(t, created.json(t), response["body"], "the original JSON object")
	effects := op["effects"].([]any)
	require.Len(t, effects, 2)
	ev := effects[0].(map[string]any)
	require.Equal(t, "event", ev["kind"])
	require.Equal(t, "quill.note.created.v1", ev["type"])
	require.Equal(t, "pending", ev["state"])
	// SPEC §4.6: present, and null, while pending.
	requireNullMember(t, ev, "published_at")
	requireNullMember(t, ev, "stream_seq")
	require.NotContains(t, ev, "processed_at", "an attachment's member")
	att := effects[1].(map[string]any)
	require.Equal(t, "attachment", att["kind"])
	require.Equal(t, "pending", att["state"])
	requireNullMember(t, att, "processed_at")
	require.NotContains(t, att, "published_at", "an event's member")
	require.NotContains(t, att, "stream_seq", "an event's member")

	// The event is the one in the outbox, for this note, as CloudEvents.
	var payload []byte
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT payload FROM outbox_events WHERE id = $1`, ev["id"]).Scan(&payload))
	ce := resp{body: payload}.json(t)
	require.Equal(t, "1.0", ce["specversion"])
	require.Equal(t, ev["id"], ce["id"])
	require.Equal(t, "/tenants/"+b.tenantA, ce["source"])
	require.Equal(t, "quill.note.created.v1", ce["type"])
	require.Equal(t, id, ce["subject"])
	require.Equal(t, "application/json", ce["datacontenttype"])
	require.Equal(t, id, ce["data"].(map[string]any)["id"])

	// A published event shows its stream sequence.
	_, err = b.pool.Exec(t.Context(), `UPDATE outbox_events SET published_at = now(), stream_seq = 42`)
	require.NoError(t, err)
	ev = b.lookup(b.tokenA, "op-1").json(t)["effects"].([]any)[0].(map[string]any)
	require.Equal(t, "published", ev["state"])
	require.Equal(t, 42.0, ev["stream_seq"])
	require.NotEmpty(t, ev["published_at"])

	// Past the outbox retention the cleanup deletes the published event;
	// the key is still remembered, and the lookup still names the event
	// as it was published — not "effects": [] nor the attachment alone.
	before := b.lookup(b.tokenA, "op-1").json(t)["effects"]
	b.clock.advance(retention.DefaultOutboxRetention + time.Hour)
	_, err = outbox.DeletePublished(t.Context(), b.pool, b.clock.now(), retention.DefaultOutboxRetention, 100)
	require.NoError(t, err)
	require.Zero(t, b.count(`SELECT count(*) FROM outbox_events`))
	require.Equal(t, before, b.lookup(b.tokenA, "op-1").json(t)["effects"])
}

// An event whose row is gone although the record kept nothing of it (here:
// deleted with the keeping trigger disabled, as before migration 00008) is
// answered as forgotten, its id and publication unknown — not left out.
func TestLookupNamesAForgottenEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.create(b.tokenA, "op-lost", note("lost")).status)
	_, err := b.pool.Exec(t.Context(), `ALTER TABLE outbox_events DISABLE TRIGGER operations_keep_cleaned_events`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `DELETE FROM outbox_events`)
	require.NoError(t, err)
	l := b.lookup(b.tokenA, "op-lost")
	require.Equal(t, http.StatusOK, l.status, "%s", l.body)
	effects := l.json(t)["effects"].([]any)
	require.Len(t, effects, 1)
	ev := effects[0].(map[string]any)
	require.Equal(t, "event", ev["kind"])
	require.Equal(t, "quill.note.created.v1", ev["type"])
	require.Equal(t, "forgotten", ev["state"])
	requireNullMember(t, ev, "id")
	requireNullMember(t, ev, "published_at")
	requireNullMember(t, ev, "stream_seq")
}

// requireNullMember checks that object m has member name, with the value null.
func requireNullMember(t *testing.T, m map[string]any, name string) {
	t.Helper()
	v, ok := m[name]
	require.True(t, ok, "member %q is present", name)
	require.Nil(t, v, "member %q is null", name)
}

func TestLookupWhileExecutingIsInProgressNeverNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, standard)
	entered, release := b.holdWrites("")
	done := make(chan resp)
	go func() { done <- b.create(b.tokenA, "op-held", note("held")) }()
	<-entered
	b.clearFaults()
	for range 3 {
		l := b.lookup(b.tokenA, "op-held")
		require.Equal(t, http.StatusOK, l.status, "%s", l.body)
		op := l.json(t)
		require.Equal(t, "in_progress", op["state"])
		require.Equal(t, "create-note", op["action"])
		require.Nil(t, op["response"], "in progress never carries a response")
		require.Nil(t, op["completed_at"])
	}
	// Another tenant asking for the same key sees nothing.
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenB, "op-held").status)
	release()
	require.Equal(t, http.StatusCreated, (<-done).status)
	require.Equal(t, "completed", b.lookup(b.tokenA, "op-held").json(t)["state"])
}

func TestLookupUnknownKeyAndOtherTenantsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.lookup(b.tokenA, "never-sent")
	require.Equal(t, http.StatusNotFound, l.status)
	require.Equal(t, "application/problem+json", l.header.Get("Content-Type"))
	require.Equal(t, "operation_not_found", l.json(t)["code"])
	require.Equal(t, "same_key", l.json(t)["retry"])

	require.Equal(t, http.StatusCreated, b.create(b.tokenA, "secret-key", note("private")).status)
	l = b.lookup(b.tokenB, "secret-key")
	require.Equal(t, http.StatusNotFound, l.status, "knowing a key must not grant access")
	require.NotContains(t, string(l.body), "private")

	bad := b.mustDo(req{method: http.MethodGet, path: "/v1/operations/a%20b", token: b.tokenA, offContract: "malformed key"})
	require.Equal(t, http.StatusBadRequest, bad.status)
	require.Equal(t, "idempotency_key_invalid", bad.json(t)["code"])
}

func TestRetentionExpiredAnswers410ThenForgottenExecutes(t *testing.T) {
	t.Parallel()
	bothCaches(t, testRetention)
}

func testRetention(t *testing.T, b *testBundle) {
	first := b.create(b.tokenA, "op-old", note("Example note"))
	require.Equal(t, http.StatusCreated, first.status)
	loc := first.header.Get("Location")

	// Past the response retention: a late retry gets 410 naming the
	// resource, never a second note — also before the cleanup compacted it.
	b.clock.advance(responseRetention + time.Minute)
	r := b.create(b.tokenA, "op-old", note("Example note"))
	require.Equal(t, http.StatusGone, r.status, "%s", r.body)
	p := r.json(t)
	require.Equal(t, "operation_result_expired", p["code"])
	require.Equal(t, "no", p["retry"])
	require.Equal(t, loc, p["resource"])
	// Different parameters are still a conflict.
	r = b.create(b.tokenA, "op-old", note("Changed"))
	require.Equal(t, http.StatusUnprocessableEntity, r.status)
	require.Equal(t, []any{"title"}, r.json(t)["fields"])

	// Cleanup compacts to a tombstone: same answers, lookup has no response.
	n, err := idempotency.Compact(t.Context(), b.pool, b.clock.now(), 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM operations WHERE response_body IS NULL AND compacted_at IS NOT NULL`))
	r = b.create(b.tokenA, "op-old", note("Example note"))
	require.Equal(t, http.StatusGone, r.status)
	require.Equal(t, loc, r.json(t)["resource"])
	op := b.lookup(b.tokenA, "op-old").json(t)
	require.Equal(t, "completed", op["state"])
	require.Nil(t, op["response"])
	require.Equal(t, loc, op["resource"])
	require.Equal(t, 1, b.notes(b.tenantA))

	// Past the key retention the key is forgotten: a request executes again.
	b.clock.advance(keyRetention)
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "op-old").status)
	r = b.create(b.tokenA, "op-old", note("Example note"))
	require.Equal(t, http.StatusCreated, r.status)
	require.Empty(t, r.header.Get("Idempotent-Replayed"))
	require.NotEqual(t, loc, r.header.Get("Location"))
	require.Equal(t, 2, b.notes(b.tenantA))
	// And cleanup removes forgotten records.
	b.clock.advance(keyRetention + time.Hour)
	n, err = idempotency.Forget(t.Context(), b.pool, b.clock.now(), 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// Concurrent lookups of an unknown key all answer 404: a lookup holding the
// key's lock is not an executing request.
func TestConcurrentLookupsDoNotSeeEachOtherAsInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	codes := make(chan int, n)
	for range n {
		go func() { codes <- b.lookup(b.tokenA, "nobody").status }()
	}
	for range n {
		require.Equal(t, http.StatusNotFound, <-codes)
	}
}
