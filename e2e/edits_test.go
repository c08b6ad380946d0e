package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/wait"
)

// editClient sends one tenant's requests to the API directly, over raw
// HTTP.
type editClient struct {
	t     *testing.T
	base  string
	token string
}

type editAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a editAnswer) note(t *testing.T) noteBody {
	t.Helper()
	n, ok := parseNote(a.body)
	require.True(t, ok, "a note: %d %s", a.status, a.body)
	return n
}

// do sends method path with the key, If-Match (0: none) and JSON body
// (nil: none).
func (c *editClient) do(method, path, key string, ifMatch int, body any) editAnswer {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(c.t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.base+path, rd)
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if ifMatch > 0 {
		req.Header.Set("If-Match", etagOf(ifMatch))
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return editAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

func (c *editClient) lookup(key string) lookup {
	c.t.Helper()
	a := c.do(http.MethodGet, "/v1/operations/"+key, "", 0, nil)
	require.Equal(c.t, http.StatusOK, a.status, "lookup %s: %s", key, a.body)
	var l lookup
	require.NoError(c.t, json.Unmarshal(a.body, &l))
	return l
}

// TestEditsThroughTheStream runs the real programs — the API, two relays
// and the worker — and edits notes over raw HTTP: a create, two updates,
// a stale update refused with 412 and a delete. The stream holds
// note.created v1, note.updated v2, v3 and note.deleted v4, in that order
// and nothing else for the note; each update's lookup lists its event as
// published at the stream sequence that holds it, the 412 none. Then 24
// notes edited the same way at once, through both relays: each note's
// stream order is its version order.
func TestEditsThroughTheStream(t *testing.T) {
	// Not parallel: see TestDemo.
	if testing.Short() {
		t.Skip("e2e: runs the real programs; skipped with -short")
	}
	seed := randomSeed()
	run := fmt.Sprintf("edits%08x", uint32(seed))
	s := setup(t, profile{Name: "edits"}, seed, run, topology{APIs: 1, Relays: 2, Workers: 1})
	c := &editClient{t: t, base: s.apiURL, token: s.tenants[0].Token}

	// The chain of one note, step by step.
	created := c.do(http.MethodPost, "/v1/notes", run+"-c", 0, map[string]any{"title": "draft", "body": "first"})
	require.Equal(t, http.StatusCreated, created.status, "%s", created.body)
	require.Equal(t, `"1"`, created.header.Get("ETag"))
	id := created.note(t).ID
	path := "/v1/notes/" + id

	u1 := c.do(http.MethodPatch, path, run+"-u1", 1, map[string]any{"title": "second draft"})
	require.Equal(t, http.StatusOK, u1.status, "%s", u1.body)
	require.Equal(t, `"2"`, u1.header.Get("ETag"))
	require.Equal(t, "second draft", u1.note(t).Title)
	replay := c.do(http.MethodPatch, path, run+"-u1", 1, map[string]any{"title": "second draft"})
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	require.Equal(t, string(u1.body), string(replay.body), "a replay is byte for byte")

	u2 := c.do(http.MethodPatch, path, run+"-u2", 2, map[string]any{"body": "second"})
	require.Equal(t, http.StatusOK, u2.status, "%s", u2.body)
	require.Equal(t, `"3"`, u2.header.Get("ETag"))
	require.Equal(t, 3, u2.note(t).Version)

	stale := c.do(http.MethodPatch, path, run+"-u3", 2, map[string]any{"title": "someone else's"})
	require.Equal(t, http.StatusPreconditionFailed, stale.status, "%s", stale.body)
	require.Equal(t, problemBody{Code: "precondition_failed", CurrentVersion: 3}, parseProblem(stale.body))
	require.Empty(t, stale.header.Get("ETag"))

	got := c.do(http.MethodGet, path, "", 0, nil)
	require.Equal(t, `"3"`, got.header.Get("ETag"))
	require.Equal(t, "second draft", got.note(t).Title, "the 412 changed nothing")

	del := c.do(http.MethodDelete, path, run+"-d", 3, nil)
	require.Equal(t, http.StatusOK, del.status, "%s", del.body)
	require.Equal(t, `"4"`, del.header.Get("ETag"))

	// The stream, once the relays published the note's four events.
	var lookups map[string]lookup
	published := func() bool {
		lookups = map[string]lookup{}
		for _, k := range []string{"c", "u1", "u2", "u3", "d"} {
			l := c.lookup(run + "-" + k)
			for _, e := range l.Effects {
				if e.Kind == "event" && e.State != "published" {
					return false
				}
			}
			lookups[k] = l
		}
		return true
	}
	for deadline := time.Now().Add(60 * time.Second); !published(); {
		require.True(t, time.Now().Before(deadline), "the note's events published within 60 s: %+v", lookups)
		wait.For(t.Context(), 200*time.Millisecond)
	}
	msgs, err := readStream(t.Context(), s.natsURL, streamName)
	require.NoError(t, err)
	var chain []string
	bySeq := map[string]uint64{}
	for _, m := range msgs {
		if m.NoteID == id && strings.HasPrefix(m.Type, "quill.note.") {
			chain = append(chain, fmt.Sprintf("%s v%d", m.Type, m.Version))
			bySeq[m.ID] = m.Seq
		}
	}
	require.Equal(t, []string{"quill.note.created.v1 v1", "quill.note.updated.v1 v2", "quill.note.updated.v1 v3", "quill.note.deleted.v1 v4"}, chain,
		"the note's events in the stream, in its order")
	for _, k := range []string{"u1", "u2"} {
		l := lookups[k]
		require.Equal(t, "update-note", l.Action, k)
		require.Len(t, l.Effects, 1, "%s: %+v", k, l.Effects)
		e := l.Effects[0]
		require.Equal(t, "event", e.Kind, k)
		require.Equal(t, "quill.note.updated.v1", e.Type, k)
		require.Equal(t, "published", e.State, k)
		require.Contains(t, bySeq, e.ID, "%s: its event is the one in the stream", k)
		require.NotNil(t, e.StreamSeq, k)
		require.Equal(t, bySeq[e.ID], uint64(*e.StreamSeq), "%s: at the sequence that holds it", k)
	}
	require.Equal(t, http.StatusPreconditionFailed, lookups["u3"].Response.Status)
	require.Empty(t, lookups["u3"].Effects, "a 412 has no effect")

	// Many notes at once, through both relays: per note, stream order is
	// version order.
	const notes, updates = 24, 4
	ids := make([]string, notes)
	var wg sync.WaitGroup
	for i := range notes {
		wg.Go(func() {
			a := c.do(http.MethodPost, "/v1/notes", fmt.Sprintf("%s-m%d", run, i), 0, map[string]any{"title": fmt.Sprintf("many %d", i)})
			if a.status != http.StatusCreated {
				t.Errorf("create %d: %d %s", i, a.status, a.body)
				return
			}
			n, _ := parseNote(a.body)
			ids[i] = n.ID
			for v := 1; v <= updates; v++ {
				a = c.do(http.MethodPatch, "/v1/notes/"+n.ID, fmt.Sprintf("%s-m%d-u%d", run, i, v), v, map[string]any{"body": fmt.Sprintf("body %d", v)})
				if a.status != http.StatusOK {
					t.Errorf("update %d of note %d: %d %s", v, i, a.status, a.body)
					return
				}
			}
			if a = c.do(http.MethodDelete, "/v1/notes/"+n.ID, fmt.Sprintf("%s-m%d-d", run, i), 0, nil); a.status != http.StatusOK {
				t.Errorf("delete of note %d: %d %s", i, a.status, a.body)
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	want := []string{"quill.note.created.v1 v1"}
	for v := 2; v <= updates+1; v++ {
		want = append(want, fmt.Sprintf("quill.note.updated.v1 v%d", v))
	}
	want = append(want, fmt.Sprintf("quill.note.deleted.v1 v%d", updates+2))
	total := 4 + notes*len(want)
	for deadline := time.Now().Add(60 * time.Second); ; {
		msgs, err = readStream(t.Context(), s.natsURL, streamName)
		require.NoError(t, err)
		if len(msgs) >= total || time.Now().After(deadline) {
			break
		}
		wait.For(t.Context(), 200*time.Millisecond)
	}
	byNote := map[string][]string{}
	for _, m := range msgs {
		if strings.HasPrefix(m.Type, "quill.note.") {
			byNote[m.NoteID] = append(byNote[m.NoteID], fmt.Sprintf("%s v%d", m.Type, m.Version))
		}
	}
	for i, nid := range ids {
		require.Equal(t, want, byNote[nid], "note %d (%s): its events in the stream, in version order", i, nid)
	}
	// Both relays took part (each claims a note's events while it holds
	// the note).
	for _, d := range s.relays {
		s.scraper.Scrape(d)
		t.Logf("%s published %.0f events", d.name, s.scraper.Total(d, "quill_relay_published_total", nil))
	}
}
