package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// editWorld is a small final state the fault suite's checks must find
// consistent — one note created, updated, raced by two agents, refused a
// stale update, updated with what it held and deleted — with handles on
// its parts, so that a test can plant one violation at a time.
type editWorld struct {
	ops                                  []*op
	st                                   *finalState
	create, u1, raceA, raceB, stale, nop *op
	del                                  *op
	events                               map[string]int // index in st.events, by the key that wrote it
}

// ev returns the event that the operation with key wrote.
func (w *editWorld) ev(key string) *eventRow { return &w.st.events[w.events[key]] }

const worldTenant = "e2e-a"

func newEditWorld(t *testing.T) *editWorld {
	t.Helper()
	w := &editWorld{st: &finalState{inbox: map[string]bool{}, lookups: map[string]lookup{}}, events: map[string]int{}}
	id := "0196a000-0000-8000-8000-000000000001"
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(s int) string {
		return t0.Add(time.Duration(s) * time.Second).Format("2006-01-02T15:04:05.000000Z")
	}
	noteJSON := func(title, body string, version, updated int) []byte {
		b, err := json.Marshal(map[string]any{"id": id, "title": title, "body": body, "created_at": at(0), "attachment": nil,
			"version": version, "updated_at": at(updated)})
		require.NoError(t, err)
		return b
	}
	problem412 := func(current int) []byte {
		return []byte(fmt.Sprintf(`{"type":"about:blank","code":"precondition_failed","retry":"no","current_version":%d}`, current))
	}
	seq := int64(0)
	// add records o as executed with the answer and, when typ is not
	// empty, the event it wrote.
	add := func(o *op, action, outcome string, status int, etag string, body []byte, resourceVersion int, typ string, data noteEventData) {
		o.Tenant = worldTenant
		o.decided = []answer{{Status: status, ETag: etag, Body: body}}
		w.ops = append(w.ops, o)
		w.st.ops = append(w.st.ops, opRow{Tenant: worldTenant, Key: o.Key, Action: action, Resource: "/v1/notes/" + id,
			Status: status, Outcome: outcome, ResourceVersion: resourceVersion})
		l := lookup{HTTP: http.StatusOK, State: "completed", Action: action}
		l.Response = &struct {
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"`
		}{status, body}
		if typ != "" {
			seq++
			e := eventRow{Seq: seq, ID: fmt.Sprintf("0196a000-0000-8000-8000-1000000000%02d", seq), Tenant: worldTenant, OpKey: o.Key,
				Aggregate: id, Type: typ, Published: true, StreamSeq: seq, Data: data}
			w.st.events = append(w.st.events, e)
			w.events[o.Key] = len(w.st.events) - 1
			w.st.stream = append(w.st.stream, streamMsg{Seq: uint64(seq), Subject: "quill." + worldTenant + "." + typ, MsgID: e.ID, ID: e.ID,
				Type: "quill." + typ + ".v1", NoteID: id, Version: data.Version})
			ss := seq
			l.Effects = append(l.Effects, struct {
				Kind      string `json:"kind"`
				ID        string `json:"id"`
				Type      string `json:"type"`
				State     string `json:"state"`
				StreamSeq *int64 `json:"stream_seq"`
			}{"event", e.ID, "quill." + typ + ".v1", "published", &ss})
		}
		w.st.lookups[worldTenant+"/"+o.Key] = l
	}
	str := func(s string) *string { return &s }

	w.create = &op{Kind: opCreate, Key: "k-c", Title: "e2e k-c", Att: attNone, NoteID: id}
	add(w.create, "create-note", "created", http.StatusCreated, `"1"`, noteJSON("e2e k-c", "first", 1, 0), 1,
		evCreated, noteEventData{ID: id, Version: 1, Title: str("e2e k-c"), Body: str("first"), UpdatedAt: at(0)})

	w.u1 = &op{Kind: opUpdate, Key: "k-u1", NoteID: id, IfMatch: 1, Known: 1, Expect: expectUpdated, SetTitle: str("e2e k-c · edit 1")}
	add(w.u1, "update-note", "updated", http.StatusOK, `"2"`, noteJSON("e2e k-c · edit 1", "first", 2, 1), 2,
		evUpdated, noteEventData{ID: id, Version: 2, Title: str("e2e k-c · edit 1"), UpdatedAt: at(1)})

	w.raceA = &op{Kind: opUpdate, Key: "k-r-a0", NoteID: id, IfMatch: 2, Known: 2, Expect: expectRace, SetBody: str("by agent 0")}
	w.raceB = &op{Kind: opUpdate, Key: "k-r-a1", NoteID: id, IfMatch: 2, Known: 2, Expect: expectRace, SetBody: str("by agent 1")}
	w.raceA.Rival, w.raceB.Rival = w.raceB, w.raceA
	add(w.raceA, "update-note", "updated", http.StatusOK, `"3"`, noteJSON("e2e k-c · edit 1", "by agent 0", 3, 2), 3,
		evUpdated, noteEventData{ID: id, Version: 3, Body: str("by agent 0"), UpdatedAt: at(2)})
	add(w.raceB, "update-note", "version_mismatch", http.StatusPreconditionFailed, "", problem412(3), 0, "", noteEventData{})

	w.stale = &op{Kind: opUpdate, Key: "k-u3", NoteID: id, IfMatch: 2, Known: 3, Expect: expectStale, SetTitle: str("e2e k-c · old")}
	add(w.stale, "update-note", "version_mismatch", http.StatusPreconditionFailed, "", problem412(3), 0, "", noteEventData{})

	w.nop = &op{Kind: opUpdate, Key: "k-u4", NoteID: id, IfMatch: 3, Known: 3, Expect: expectUnchanged, SetBody: str("by agent 0")}
	add(w.nop, "update-note", "unchanged", http.StatusOK, `"3"`, noteJSON("e2e k-c · edit 1", "by agent 0", 3, 2), 3, "", noteEventData{})

	w.del = &op{Kind: opDelete, Key: "k-d", NoteID: id, ExpectStatus: http.StatusOK, IfMatch: 3}
	add(w.del, "delete-note", "deleted", http.StatusOK, `"4"`, []byte(fmt.Sprintf(`{"id":%q,"deleted_at":%q}`, id, at(3))), 4,
		evDeleted, noteEventData{ID: id, Version: 4, DeletedAt: at(3)})

	w.st.notes = []noteRow{{ID: id, Tenant: worldTenant, Title: "e2e k-c · edit 1", Body: "by agent 0", Deleted: true, Version: 4,
		CreatedAt: t0, UpdatedAt: t0.Add(2 * time.Second)}}
	return w
}

func (w *editWorld) check() *verdict {
	v := newVerdict()
	checkAll(v, w.ops, w.st, consumerName, subjectPrefix)
	return v
}

// The checks of updates can fail: the consistent world passes every check
// of the suite, and each planted violation fails the check that names it.
func TestEditChecksCanFail(t *testing.T) {
	t.Parallel()
	v := newEditWorld(t).check()
	require.Zero(t, v.Failed(), "the consistent world: %v %v", v.counts, v.ex)

	for _, tc := range []struct {
		name  string
		plant func(*editWorld)
		check string
	}{
		{"an accepted update's event is missing", func(w *editWorld) {
			id := w.ev(w.raceA.Key).ID
			w.st.events = removeEvent(w.st.events, id)
			w.st.stream = removeMsg(w.st.stream, id)
			w.st.lookups[worldTenant+"/"+w.raceA.Key] = lookup{HTTP: 200, State: "completed", Action: "update-note", Response: w.st.lookups[worldTenant+"/"+w.raceA.Key].Response}
		}, "a note's events are its versions, contiguous, in commit order"},
		{"an accepted update wrote no event", func(w *editWorld) {
			w.ev(w.u1.Key).OpKey = "k-other"
		}, "one note.updated per accepted update, none otherwise"},
		{"an unchanged update wrote an event", func(w *editWorld) {
			w.ev(w.raceA.Key).OpKey = w.nop.Key
		}, "one note.updated per accepted update, none otherwise"},
		{"the stream swapped two versions", func(w *editWorld) {
			w.st.stream[1].Version, w.st.stream[2].Version = w.st.stream[2].Version, w.st.stream[1].Version
		}, "a note's stream order is its version order"},
		{"both agents of a race won", func(w *editWorld) {
			w.raceB.decided[0] = answer{Status: http.StatusOK, ETag: `"3"`, Body: w.raceA.decided[0].Body}
			l := w.st.lookups[worldTenant+"/"+w.raceB.Key]
			l.Response.Status, l.Response.Body = http.StatusOK, w.raceA.decided[0].Body
		}, "two agents from one version: one 200, one 412, one event"},
		{"a race's loser names another version", func(w *editWorld) {
			body := []byte(`{"code":"precondition_failed","current_version":4}`)
			w.raceB.decided[0].Body = body
			w.st.lookups[worldTenant+"/"+w.raceB.Key].Response.Body = body
		}, "two agents from one version: one 200, one 412, one event"},
		{"a replay differs in its ETag", func(w *editWorld) {
			w.u1.decided = append(w.u1.decided, answer{Status: http.StatusOK, ETag: `"3"`, Body: w.u1.decided[0].Body, Replayed: true})
		}, "replays answer byte for byte"},
		{"an acknowledged update is lost from the note", func(w *editWorld) {
			w.st.notes[0].Title = "e2e k-c"
		}, "the note holds its last accepted version"},
		{"the deleted note kept its version", func(w *editWorld) {
			w.st.notes[0].Version = 3
		}, "the note holds its last accepted version"},
		{"a note.updated carries an unchanged field", func(w *editWorld) {
			body := "by agent 0"
			w.ev(w.u1.Key).Data.Body = &body
		}, "a note.updated carries its update's key and exactly the fields it changed"},
		{"the delete's event skips a version", func(w *editWorld) {
			w.ev(w.del.Key).Data.Version = 5
		}, "a note's events are its versions, contiguous, in commit order"},
		{"an update's lookup lists no event", func(w *editWorld) {
			l := w.st.lookups[worldTenant+"/"+w.u1.Key]
			l.Effects = nil
			w.st.lookups[worldTenant+"/"+w.u1.Key] = l
		}, "an update's lookup lists its event"},
		{"the record says another outcome", func(w *editWorld) {
			for i := range w.st.ops {
				if w.st.ops[i].Key == w.stale.Key {
					w.st.ops[i].Outcome = "unchanged"
				}
			}
		}, "one record per update key"},
		{"a stale update was accepted", func(w *editWorld) {
			body := []byte(strings.Replace(string(w.raceA.decided[0].Body), `"by agent 0"`, `"old"`, 1))
			w.stale.SetTitle, w.stale.SetBody = nil, &[]string{"old"}[0]
			w.stale.decided[0] = answer{Status: http.StatusOK, ETag: `"3"`, Body: body}
			l := w.st.lookups[worldTenant+"/"+w.stale.Key]
			l.Response.Status, l.Response.Body = http.StatusOK, body
		}, "an update answers what its client's view implies"},
		{"an update answered another ETag", func(w *editWorld) {
			w.u1.decided[0].ETag = `"1"`
		}, "an update's ETag is the version it answered"},
		{"a delete answered another ETag", func(w *editWorld) {
			w.del.decided[0].ETag = `"3"`
		}, "a delete answers the version it made"},
		{"two accepted updates made one version", func(w *editWorld) {
			w.raceA.IfMatch = 1
			w.raceA.decided[0].Body = []byte(strings.Replace(string(w.raceA.decided[0].Body), `"version":3`, `"version":2`, 1))
			w.st.lookups[worldTenant+"/"+w.raceA.Key].Response.Body = w.raceA.decided[0].Body
		}, "a note's accepted updates answered versions 2..N, one each"},
		{"an accepted update changed a field it does not set", func(w *editWorld) {
			body := []byte(strings.Replace(string(w.u1.decided[0].Body), `"first"`, `"changed"`, 1))
			w.u1.decided[0].Body = body
			w.st.lookups[worldTenant+"/"+w.u1.Key].Response.Body = body
		}, "an accepted update applies its fields to the version before"},
		{"an update that never executed left an event", func(w *editWorld) {
			o := &op{Kind: opUpdate, Tenant: worldTenant, Key: "k-u9", NoteID: w.u1.NoteID, IfMatch: 3, Expect: expectEither}
			w.ops = append(w.ops, o)
			w.st.lookups[worldTenant+"/"+o.Key] = lookup{HTTP: http.StatusNotFound, Code: "operation_not_found"}
			w.ev(w.del.Key).OpKey = o.Key
		}, "no effect for an update that never executed"},
		{"an update record without an operation", func(w *editWorld) {
			w.st.ops = append(w.st.ops, opRow{Tenant: worldTenant, Key: "k-stray", Action: "update-note", Outcome: "unchanged"})
		}, "operation records = executed updates"},
		{"an update's lookup names another action", func(w *editWorld) {
			l := w.st.lookups[worldTenant+"/"+w.stale.Key]
			l.Action = "delete-note"
			w.st.lookups[worldTenant+"/"+w.stale.Key] = l
		}, "an update's lookup names its action"},
	} {
		w := newEditWorld(t)
		tc.plant(w)
		v := w.check()
		require.Positive(t, v.counts[tc.check], "%s: want %q to fail; failed %v", tc.name, tc.check, v.counts)
	}
}

func removeEvent(es []eventRow, id string) []eventRow {
	var out []eventRow
	for _, e := range es {
		if e.ID != id {
			out = append(out, e)
		}
	}
	return out
}

func removeMsg(ms []streamMsg, id string) []streamMsg {
	var out []streamMsg
	for _, m := range ms {
		if m.ID != id {
			out = append(out, m)
		}
	}
	return out
}
