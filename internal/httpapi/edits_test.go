package httpapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/testkit"
)

// patch sends an update of note id under key, made against ifMatch (""
// sends no If-Match).
func (b *testBundle) patch(token, key, id, ifMatch string, body any, offContract ...string) resp {
	b.t.Helper()
	r := req{method: http.MethodPatch, path: "/v1/notes/" + id, token: token, key: key, body: body}
	if ifMatch != "" {
		r.header = map[string]string{"If-Match": ifMatch}
	}
	if len(offContract) > 0 {
		r.offContract = offContract[0]
	}
	return b.mustDo(r)
}

// eventData returns the data of the tenant's outbox events of typ, oldest
// first.
func (b *testBundle) eventData(typ string) []map[string]any {
	b.t.Helper()
	rows, err := b.pool.Query(b.t.Context(), `SELECT payload FROM outbox_events WHERE tenant = $1 AND type = $2 ORDER BY seq`, b.tenantA, typ)
	require.NoError(b.t, err)
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var payload []byte
		require.NoError(b.t, rows.Scan(&payload))
		var ce struct {
			Data map[string]any `json:"data"`
		}
		require.NoError(b.t, json.Unmarshal(payload, &ce))
		out = append(out, ce.Data)
	}
	require.NoError(b.t, rows.Err())
	return out
}

// An update under If-Match makes the next version, answers the note with
// its ETag, and writes one note.updated carrying only what changed; GET
// shows the version; the lookup lists the event.
func TestUpdateNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.create(b.tokenA, "c1", map[string]any{"title": "draft", "body": "text"})
	require.Equal(t, `"1"`, c.header.Get("ETag"))
	created := c.json(t)
	id := created["id"].(string)
	require.Equal(t, 1.0, created["version"])
	require.Equal(t, created["created_at"], created["updated_at"])

	g := b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA})
	require.Equal(t, `"1"`, g.header.Get("ETag"))

	u := b.patch(b.tokenA, "u1", id, `"1"`, map[string]any{"title": "final"})
	require.Equal(t, http.StatusOK, u.status, "%s", u.body)
	require.Equal(t, `"2"`, u.header.Get("ETag"))
	n := u.json(t)
	require.Equal(t, "final", n["title"])
	require.Equal(t, "text", n["body"], "a field the update does not name is kept")
	require.Equal(t, 2.0, n["version"])
	require.Equal(t, created["created_at"], n["created_at"])
	require.NotEqual(t, created["updated_at"], n["updated_at"])

	g = b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA})
	require.Equal(t, `"2"`, g.header.Get("ETag"))
	require.Equal(t, n, g.json(t))

	events := b.eventData("note.updated")
	require.Len(t, events, 1)
	require.Equal(t, map[string]any{"id": id, "version": 2.0, "title": "final", "updated_at": n["updated_at"]}, events[0])
	require.Equal(t, 1.0, b.eventData("note.created")[0]["version"])

	// Setting the body to "" is a change, and the event says so.
	u = b.patch(b.tokenA, "u2", id, `"2"`, map[string]any{"body": ""})
	require.Equal(t, http.StatusOK, u.status, "%s", u.body)
	require.Equal(t, map[string]any{"id": id, "version": 3.0, "body": "", "updated_at": u.json(t)["updated_at"]}, b.eventData("note.updated")[1])

	op := b.lookup(b.tokenA, "u1").json(t)
	require.Equal(t, "update-note", op["action"])
	require.Equal(t, 200.0, op["response"].(map[string]any)["status"])
	effects := op["effects"].([]any)
	require.Len(t, effects, 1)
	require.Equal(t, "quill.note.updated.v1", effects[0].(map[string]any)["type"])
	require.Equal(t, 2.0, testkit.Gathered(t, b.reg, "quill_business_effects_total", map[string]string{"action": "update-note"}))
}

// If-Match is one of the operation's parameters: a retry under the key
// replays the recorded 200 even after the note changed since, and the key
// with another If-Match or other fields is 422 naming them.
func TestUpdateReplayAfterALaterChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create(b.tokenA, "c1", note("one")).json(t)["id"].(string)
	first := b.patch(b.tokenA, "u1", id, `"1"`, map[string]any{"title": "two"})
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	second := b.patch(b.tokenA, "u2", id, `"2"`, map[string]any{"title": "three"})
	require.Equal(t, http.StatusOK, second.status, "%s", second.body)

	again := b.patch(b.tokenA, "u1", id, `"1"`, map[string]any{"title": "two"})
	require.Equal(t, http.StatusOK, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, `"2"`, again.header.Get("ETag"), "the ETag the update answered, not the note's now")
	require.Equal(t, string(first.body), string(again.body))
	require.Len(t, b.eventData("note.updated"), 2, "a replay writes nothing")

	reused := b.patch(b.tokenA, "u1", id, `"3"`, map[string]any{"title": "four"})
	require.Equal(t, http.StatusUnprocessableEntity, reused.status, "%s", reused.body)
	require.ElementsMatch(t, []any{"if_match", "title"}, reused.json(t)["fields"])
	require.Equal(t, "three", b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA}).json(t)["title"])
}

// A stale If-Match is 412 with the current version, final and recorded: the
// retry replays it. Without If-Match it is 428, not recorded. An update
// that changes nothing is recorded but makes no version and no event. A
// note that is not there (deleted, another tenant's) is 404, recorded.
func TestUpdateRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create(b.tokenA, "c1", note("one")).json(t)["id"].(string)
	require.Equal(t, http.StatusOK, b.patch(b.tokenA, "u1", id, `"1"`, map[string]any{"title": "two"}).status)

	stale := b.patch(b.tokenA, "u2", id, `"1"`, map[string]any{"title": "mine"})
	require.Equal(t, http.StatusPreconditionFailed, stale.status, "%s", stale.body)
	p := stale.json(t)
	require.Equal(t, "precondition_failed", p["code"])
	require.Equal(t, "no", p["retry"])
	require.Equal(t, 2.0, p["current_version"])
	require.Empty(t, stale.header.Get("ETag"))
	replay := b.patch(b.tokenA, "u2", id, `"1"`, map[string]any{"title": "mine"})
	require.Equal(t, http.StatusPreconditionFailed, replay.status)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, string(stale.body), string(replay.body))

	missing := b.patch(b.tokenA, "u3", id, "", map[string]any{"title": "x"}, "no If-Match")
	require.Equal(t, http.StatusPreconditionRequired, missing.status, "%s", missing.body)
	require.Equal(t, "precondition_required", missing.json(t)["code"])
	require.Equal(t, "after_fixing", missing.json(t)["retry"])
	require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, "u3").status, "a 428 is not recorded")

	same := b.patch(b.tokenA, "u4", id, `"2"`, map[string]any{"title": "two"})
	require.Equal(t, http.StatusOK, same.status, "%s", same.body)
	require.Equal(t, `"2"`, same.header.Get("ETag"))
	require.Equal(t, 2.0, same.json(t)["version"])
	require.Len(t, b.eventData("note.updated"), 1, "an update that changes nothing writes no event")
	require.Empty(t, b.lookup(b.tokenA, "u4").json(t)["effects"])

	other := b.patch(b.tokenB, "u5", id, `"2"`, map[string]any{"title": "theirs"})
	require.Equal(t, http.StatusNotFound, other.status)
	require.Equal(t, 404.0, b.mustDo(req{method: http.MethodGet, path: "/v1/operations/u5", token: b.tokenB}).json(t)["response"].(map[string]any)["status"])

	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: "d1"}).status)
	gone := b.patch(b.tokenA, "u6", id, `"3"`, map[string]any{"title": "late"})
	require.Equal(t, http.StatusNotFound, gone.status, "%s", gone.body)
	require.Equal(t, "not_found", gone.json(t)["code"])
	require.Equal(t, 1.0, testkit.Gathered(t, b.reg, "quill_business_effects_total", map[string]string{"action": "update-note"}))
}

// Malformed updates are answered before anything executes, and nothing is
// recorded.
func TestUpdateValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create(b.tokenA, "c1", note("one")).json(t)["id"].(string)
	for i, tc := range []struct {
		name, ifMatch string
		body          any
		status        int
		code, field   string
	}{
		{"weak tag", `W/"1"`, map[string]any{"title": "x"}, 400, "validation_failed", "If-Match"},
		{"star", `*`, map[string]any{"title": "x"}, 400, "validation_failed", "If-Match"},
		{"list", `"1", "2"`, map[string]any{"title": "x"}, 400, "validation_failed", "If-Match"},
		{"unquoted", `1`, map[string]any{"title": "x"}, 400, "validation_failed", "If-Match"},
		{"sets nothing", `"1"`, map[string]any{}, 400, "validation_failed", "title"},
		{"null title", `"1"`, `{"title":null}`, 400, "validation_failed", "title"},
		{"null body", `"1"`, `{"body":null}`, 400, "validation_failed", "body"},
		{"empty title", `"1"`, map[string]any{"title": ""}, 400, "validation_failed", "title"},
		{"control in title", `"1"`, map[string]any{"title": "a\u0007"}, 400, "validation_failed", "title"},
		{"number title", `"1"`, `{"title":3}`, 400, "invalid_json", ""},
		{"unknown member", `"1"`, map[string]any{"title": "x", "attachment": nil}, 400, "invalid_json", ""},
		{"not an object", `"1"`, `[]`, 400, "invalid_json", ""},
	} {
		key := fmt.Sprintf("v%d", i)
		r := b.patch(b.tokenA, key, id, tc.ifMatch, tc.body, "invalid: "+tc.name)
		require.Equal(t, tc.status, r.status, "%s: %s", tc.name, r.body)
		p := r.json(t)
		require.Equal(t, tc.code, p["code"], tc.name)
		if tc.field != "" {
			require.Equal(t, tc.field, p["errors"].([]any)[0].(map[string]any)["field"], tc.name)
		}
		require.Equal(t, http.StatusNotFound, b.lookup(b.tokenA, key).status, "%s: not recorded", tc.name)
	}
	require.Equal(t, 1.0, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id, token: b.tokenA}).json(t)["version"])
}

func TestParseIfMatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []string
		want int
		ok   bool
	}{
		{[]string{`"1"`}, 1, true},
		{[]string{` "42" `}, 42, true},
		{[]string{`"2147483647"`}, 2147483647, true},
		{[]string{`"2147483648"`}, 0, false},
		{[]string{`"9999999999"`}, 0, false},
		{[]string{`"0"`}, 0, false},
		{[]string{`"01"`}, 0, false},
		{[]string{`"-1"`}, 0, false},
		{[]string{`"+1"`}, 0, false},
		{[]string{`""`}, 0, false},
		{[]string{`"`}, 0, false},
		{[]string{`1`}, 0, false},
		{[]string{`"1`}, 0, false},
		{[]string{`W/"1"`}, 0, false},
		{[]string{`*`}, 0, false},
		{[]string{`"1", "2"`}, 0, false},
		{[]string{`"1"`, `"1"`}, 0, false},
		{[]string{`"a"`}, 0, false},
		{[]string{`"1 "`}, 0, false},
	} {
		got, err := httpapi.ParseIfMatch(tc.in)
		if !tc.ok {
			require.Error(t, err, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// Two agents updating one note from the same version: exactly one 200, the
// other 412 naming the winner's version, one event — every round.
func TestConcurrentUpdatesFromOneVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rounds = 10
	for round := range rounds {
		id := b.create(b.tokenA, fmt.Sprintf("c%d", round), note("race")).json(t)["id"].(string)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			codes = map[int]int{}
			cur   []any
		)
		for agent := range 2 {
			wg.Go(func() {
				r, err := b.do(t.Context(), req{method: http.MethodPatch, path: "/v1/notes/" + id, token: b.tokenA,
					key: fmt.Sprintf("r%d-a%d", round, agent), body: map[string]any{"title": fmt.Sprintf("agent %d", agent)},
					header: map[string]string{"If-Match": `"1"`}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				codes[r.status]++
				if r.status == http.StatusPreconditionFailed {
					var p map[string]any
					_ = json.Unmarshal(r.body, &p)
					cur = append(cur, p["current_version"])
				}
			})
		}
		wg.Wait()
		require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusPreconditionFailed: 1}, codes, "round %d", round)
		require.Equal(t, []any{2.0}, cur)
		require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox_events WHERE type = 'note.updated' AND aggregate_id = $1`, id))
	}
}

// DELETE takes If-Match: another version is 412, recorded; the version is
// the delete's precondition, and the delete is a version of its own, its
// event carrying it.
func TestDeleteIfMatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.create(b.tokenA, "c1", note("one")).json(t)["id"].(string)
	require.Equal(t, http.StatusOK, b.patch(b.tokenA, "u1", id, `"1"`, map[string]any{"body": "b"}).status)
	del := func(key, ifMatch string) resp {
		return b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + id, token: b.tokenA, key: key,
			header: map[string]string{"If-Match": ifMatch}})
	}
	stale := del("d1", `"1"`)
	require.Equal(t, http.StatusPreconditionFailed, stale.status, "%s", stale.body)
	require.Equal(t, 2.0, stale.json(t)["current_version"])
	require.Equal(t, http.StatusPreconditionFailed, del("d1", `"1"`).status, "replayed")
	require.Equal(t, http.StatusUnprocessableEntity, del("d1", `"2"`).status, "the key is recorded with If-Match 1")

	ok := del("d2", `"2"`)
	require.Equal(t, http.StatusOK, ok.status, "%s", ok.body)
	require.Equal(t, `"3"`, ok.header.Get("ETag"))
	events := b.eventData("note.deleted")
	require.Len(t, events, 1)
	require.Equal(t, 3.0, events[0]["version"])
	again := del("d2", `"2"`)
	require.Equal(t, `"3"`, again.header.Get("ETag"))
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
}

// Whatever an If-Match value holds, it names one version, 1 to 2^31-1,
// whose ETag is the value without its surrounding blanks, or it is
// refused.
func FuzzParseIfMatch(f *testing.F) {
	for _, s := range []string{`"1"`, `W/"1"`, `*`, `"01"`, `"1", "2"`, ` "7" `, `"2147483648"`, `""`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, err := httpapi.ParseIfMatch([]string{v})
		if err != nil {
			return
		}
		require.Positive(t, n)
		require.LessOrEqual(t, n, 1<<31-1)
		require.Equal(t, strings.Trim(v, " \t"), fmt.Sprintf("%q", fmt.Sprint(n)))
	})
}
