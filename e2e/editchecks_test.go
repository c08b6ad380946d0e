package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// editTally counts what the updates of a run came to.
type editTally struct {
	// Executed updates by outcome: a new version, nothing changed, 412,
	// 404.
	Accepted, Unchanged, Refused, Gone int
	// Races is the pairs of agents that updated one note from one
	// version, FaultedRaces those of them where a request went without a
	// decided answer (and was resent); After412 the updates sent as a new
	// intent after a 412.
	Races, FaultedRaces, After412 int
	// Notes with an accepted update, and the highest version a note
	// reached.
	EditedNotes, MaxVersion int
}

// problemBody is the part of a problem the checks read.
type problemBody struct {
	Code           string `json:"code"`
	CurrentVersion int    `json:"current_version"`
}

// proveEdits fails t unless the run's updates took every path: new
// versions, updates that changed nothing, 412s, races, and races whose
// requests the faults hit.
func proveEdits(t *testing.T, f *figures) {
	t.Helper()
	e := f.tally.Edits
	if e.Accepted == 0 || e.Unchanged == 0 || e.Refused == 0 || e.Races == 0 || e.After412 == 0 {
		t.Errorf("LOAD: the updates did not take every path: %d new versions, %d unchanged, %d refused 412, %d races, %d new intents after a 412",
			e.Accepted, e.Unchanged, e.Refused, e.Races, e.After412)
	}
	if e.FaultedRaces == 0 {
		t.Errorf("FAULT not proven: no request of a race's agents went without a decided answer (%d races)", e.Races)
	}
}

func parseProblem(b []byte) problemBody {
	var p problemBody
	_ = json.Unmarshal(b, &p)
	return p
}

// accepted is an update that made a version: the operation and the note
// it answered.
type acceptedUpdate struct {
	o *op
	n noteBody
}

// Note event types in the outbox and, with their prefix and suffix, in the
// stream.
const (
	evCreated = "note.created"
	evUpdated = "note.updated"
	evDeleted = "note.deleted"
)

// checkEdits verifies the updates: J, every update key has exactly one
// outcome — its record, its answer, its events and its lookup agree, and
// what a client with a certain view expected is what it got; K, each
// note's versions are contiguous (created 1, one note.updated per
// accepted changing update, 2..N, note.deleted N+1) in what the API
// answered, in the note, in the outbox and in the stream's order, and
// every acknowledged update is in the note's state or superseded by a
// later version; L, two agents updating one note from one version got
// exactly one 200, one 412 and one event.
func checkEdits(v *verdict, ops []*op, st *finalState, res map[*op]resolution, createByTitle map[string]*op) editTally {
	var tally editTally
	eventsByKey := map[string][]eventRow{}
	noteEvents := map[string][]eventRow{}
	for _, e := range st.events {
		eventsByKey[e.Tenant+"/"+e.OpKey] = append(eventsByKey[e.Tenant+"/"+e.OpKey], e)
		if strings.HasPrefix(e.Type, "note.") {
			noteEvents[e.Aggregate] = append(noteEvents[e.Aggregate], e)
		}
	}
	streamByNote := map[string][]streamMsg{}
	for _, m := range st.stream {
		if strings.HasPrefix(m.Type, "quill.note.") {
			streamByNote[m.NoteID] = append(streamByNote[m.NoteID], m)
		}
	}
	for _, ms := range streamByNote {
		sort.Slice(ms, func(i, j int) bool { return ms[i].Seq < ms[j].Seq })
	}
	records := map[string]opRow{}
	updateRecords := 0
	for _, r := range st.ops {
		records[r.Tenant+"/"+r.Key] = r
		if r.Action == "update-note" {
			updateRecords++
		}
	}

	// J. Each update's one outcome.
	accepted := map[string][]acceptedUpdate{} // note id → its accepted updates
	unchanged := map[string][]acceptedUpdate{}
	refused := map[string][]*op{} // note id → updates answered 412
	executedUpdates := 0
	for _, o := range ops {
		if o.Kind != opUpdate {
			continue
		}
		if o.After412 {
			tally.After412++
		}
		r, ok := res[o]
		if !ok {
			continue // unresolved: B failed it
		}
		key := o.Tenant + "/" + o.Key
		evs := eventsByKey[key]
		if !r.executed {
			if len(evs) != 0 {
				v.fail("no effect for an update that never executed", "%s: lookup 404 but %d events", o.Key, len(evs))
			}
			continue
		}
		executedUpdates++
		rec, hasRec := records[key]
		l := st.lookups[key]
		if l.Action != "update-note" {
			v.fail("an update's lookup names its action", "%s: action %q", o.Key, l.Action)
		}
		var lookupEvents []string
		for _, e := range l.Effects {
			if e.Kind == "event" {
				lookupEvents = append(lookupEvents, e.Type+" "+e.ID)
			}
		}
		// outcome is the record's outcome the answer implies; events the
		// note.updated the update wrote (0 or 1).
		var outcome string
		var version, events int
		var n noteBody
		current := 0
		switch r.status {
		case http.StatusOK:
			var ok bool
			if n, ok = parseNote(r.body); !ok || n.ID != o.NoteID {
				v.fail("an update's 200 is its note", "%s on note %s: %s", o.Key, o.NoteID, r.body)
				continue
			}
			if (o.SetTitle != nil && n.Title != *o.SetTitle) || (o.SetBody != nil && n.Body != *o.SetBody) {
				v.fail("an update's answer holds what it set", "%s: set title %v body %v, answered %q %q", o.Key, strPtr(o.SetTitle), strPtr(o.SetBody), n.Title, n.Body)
			}
			switch n.Version {
			case o.IfMatch + 1:
				outcome, version, events = "updated", n.Version, 1
				accepted[o.NoteID] = append(accepted[o.NoteID], acceptedUpdate{o, n})
				tally.Accepted++
			case o.IfMatch:
				outcome, version = "unchanged", n.Version
				unchanged[o.NoteID] = append(unchanged[o.NoteID], acceptedUpdate{o, n})
				tally.Unchanged++
			default:
				v.fail("a 200 update answers the next version or, changing nothing, the same", "%s: If-Match %d, answered version %d", o.Key, o.IfMatch, n.Version)
				continue
			}
		case http.StatusPreconditionFailed:
			p := parseProblem(r.body)
			current = p.CurrentVersion
			if p.Code != "precondition_failed" || current <= o.IfMatch {
				v.fail("a 412 is precondition_failed naming a later version", "%s: If-Match %d, answered %s", o.Key, o.IfMatch, r.body)
			}
			outcome = "version_mismatch"
			refused[o.NoteID] = append(refused[o.NoteID], o)
			tally.Refused++
		case http.StatusNotFound:
			if p := parseProblem(r.body); p.Code != "not_found" {
				v.fail("a 404 update is not_found", "%s: %s", o.Key, r.body)
			}
			outcome = "nothing_to_update"
			tally.Gone++
		default:
			v.fail("updates answer 200, 412 or 404", "%s: %d %s", o.Key, r.status, r.body)
			continue
		}
		switch {
		case !hasRec:
			v.fail("one record per update key", "%s: executed, but no operation record", o.Key)
		case rec.Action != "update-note" || rec.Outcome != outcome || rec.ResourceVersion != version:
			v.fail("one record per update key", "%s: record %s %s version %d, answer says %s version %d",
				o.Key, rec.Action, rec.Outcome, rec.ResourceVersion, outcome, version)
		}
		if len(evs) != events || (events == 1 && (evs[0].Type != evUpdated || evs[0].Aggregate != o.NoteID || evs[0].Data.Version != version)) {
			v.fail("one note.updated per accepted update, none otherwise", "%s (%s, version %d): events %s", o.Key, outcome, version, eventList(evs))
		}
		if len(lookupEvents) != events || (events == 1 && len(evs) == 1 && lookupEvents[0] != "quill.note.updated.v1 "+evs[0].ID) {
			v.fail("an update's lookup lists its event", "%s (%s): lookup effects %v, outbox %s", o.Key, outcome, lookupEvents, eventList(evs))
		}
		if d := o.Decided(); d != nil {
			want := ""
			if r.status == http.StatusOK {
				want = etagOf(n.Version)
			}
			if d.ETag != want {
				v.fail("an update's ETag is the version it answered", "%s: %d with ETag %q, want %q", o.Key, d.Status, d.ETag, want)
			}
		}
		expected := true
		switch o.Expect {
		case expectUpdated:
			expected = outcome == "updated"
		case expectUnchanged:
			expected = outcome == "unchanged"
		case expectStale:
			expected = outcome == "version_mismatch" && current == o.Known
		case expectGone:
			expected = outcome == "nothing_to_update"
		case expectEither:
			expected = outcome == "updated" || outcome == "version_mismatch"
		case expectRace:
			expected = outcome == "updated" || outcome == "version_mismatch" // and L pairs them
		}
		if !expected {
			v.fail("an update answers what its client's view implies", "%s (%s, If-Match %d, known %d): %d %s", o.Key, o.Expect, o.IfMatch, o.Known, r.status, r.body)
		}
	}
	if updateRecords != executedUpdates {
		v.fail("operation records = executed updates", "%d update-note records, %d executed update operations", updateRecords, executedUpdates)
	}

	// L. Races: two agents from one version.
	for _, a := range ops {
		b := a.Rival
		if a.Kind != opUpdate || a.Expect != expectRace || b == nil || a.Key > b.Key {
			continue
		}
		tally.Races++
		if a.Faulted() || b.Faulted() {
			tally.FaultedRaces++
		}
		ra, oka := res[a]
		rb, okb := res[b]
		if !oka || !okb || !ra.executed || !rb.executed {
			v.fail("two agents from one version: both executed", "%s / %s: resolved %t %t, executed %t %t", a.Key, b.Key, oka, okb, ra.executed, rb.executed)
			continue
		}
		win, lose, wr, lr := a, b, ra, rb
		if ra.status != http.StatusOK {
			win, lose, wr, lr = b, a, rb, ra
		}
		n, _ := parseNote(wr.body)
		p := parseProblem(lr.body)
		events := len(eventsByKey[a.Tenant+"/"+a.Key]) + len(eventsByKey[b.Tenant+"/"+b.Key])
		ok := wr.status == http.StatusOK && lr.status == http.StatusPreconditionFailed && n.Version == win.IfMatch+1 && events == 1
		// The loser's 412 names the winner's version unless it ran after
		// its client gave up waiting (and moved on).
		if !lose.GaveUp() && p.CurrentVersion != win.IfMatch+1 {
			ok = false
		}
		if !ok {
			v.fail("two agents from one version: one 200, one 412, one event", "%s / %s from version %d: %d %s; %d %s; %d events",
				win.Key, lose.Key, win.IfMatch, wr.status, wr.body, lr.status, lr.body, events)
		}
	}

	// K. Each note's versions.
	deletesOK := map[string][]*op{}
	for _, o := range ops {
		if r, ok := res[o]; ok && o.Kind == opDelete && r.executed && r.status == http.StatusOK {
			deletesOK[o.NoteID] = append(deletesOK[o.NoteID], o)
		}
	}
	for _, note := range st.notes {
		c := createByTitle[createTitleOf(note.Title)]
		if c == nil {
			continue // C failed it
		}
		base, ok := parseNote(res[c].body)
		if !ok || base.ID != note.ID || base.Version != 1 {
			v.fail("a create answers version 1", "%s: %s", c.Key, res[c].body)
			continue
		}
		ups := accepted[note.ID]
		sort.Slice(ups, func(i, j int) bool { return ups[i].n.Version < ups[j].n.Version })
		var versions []int
		for _, u := range ups {
			versions = append(versions, u.n.Version)
		}
		last := 1 + len(ups)
		if len(ups) > 0 {
			tally.EditedNotes++
		}
		tally.MaxVersion = max(tally.MaxVersion, last)
		contiguous := true
		for i, ver := range versions {
			if ver != i+2 {
				contiguous = false
			}
		}
		if !contiguous {
			v.fail("a note's accepted updates answered versions 2..N, one each", "note %s: %v", note.ID, versions)
			continue
		}
		// The state at each version: the create's, then each update's
		// fields applied to the one before.
		states := []noteBody{{}, base}
		for _, u := range ups {
			prev := states[len(states)-1]
			title, body := prev.Title, prev.Body
			if u.o.SetTitle != nil {
				title = *u.o.SetTitle
			}
			if u.o.SetBody != nil {
				body = *u.o.SetBody
			}
			if u.n.Title != title || u.n.Body != body || u.n.CreatedAt != base.CreatedAt {
				v.fail("an accepted update applies its fields to the version before", "%s (version %d): answered %q %q %s, want %q %q %s",
					u.o.Key, u.n.Version, u.n.Title, u.n.Body, u.n.CreatedAt, title, body, base.CreatedAt)
			}
			if title == prev.Title && body == prev.Body {
				v.fail("an accepted update changed something", "%s (version %d)", u.o.Key, u.n.Version)
			}
			states = append(states, u.n)
		}
		for _, u := range unchanged[note.ID] {
			if u.n.Version > last || u.n.Title != states[u.n.Version].Title || u.n.Body != states[u.n.Version].Body {
				v.fail("an unchanged update answers the note at its version", "%s (version %d of %d): %q %q", u.o.Key, u.n.Version, last, u.n.Title, u.n.Body)
			}
		}
		for _, o := range refused[note.ID] {
			if cur := parseProblem(res[o].body).CurrentVersion; cur > last {
				v.fail("a 412 names a version the note had", "%s: current_version %d, the note reached %d", o.Key, cur, last)
			}
		}

		// Every acknowledged update is in the note or superseded by a
		// later one: the note holds its last version's fields.
		final := states[last]
		wantVersion := last
		if note.Deleted {
			wantVersion++
		}
		updatedAt, _ := time.Parse(time.RFC3339Nano, final.UpdatedAt)
		if note.Title != final.Title || note.Body != final.Body || note.Version != wantVersion || !note.UpdatedAt.Equal(updatedAt) {
			v.fail("the note holds its last accepted version", "note %s (deleted %t): %q %q version %d updated %s, want %q %q version %d updated %s",
				note.ID, note.Deleted, note.Title, note.Body, note.Version, note.UpdatedAt.Format(time.RFC3339Nano),
				final.Title, final.Body, wantVersion, final.UpdatedAt)
		}
		for _, d := range deletesOK[note.ID] {
			if a := d.Decided(); a != nil && a.ETag != etagOf(last+1) {
				v.fail("a delete answers the version it made", "%s on note %s: ETag %q, want %q", d.Key, note.ID, a.ETag, etagOf(last+1))
			}
		}

		// The outbox, in commit order, and the stream, in its order: 1,
		// 2..N, N+1.
		want := []string{fmt.Sprintf("%s 1", evCreated)}
		for ver := 2; ver <= last; ver++ {
			want = append(want, fmt.Sprintf("%s %d", evUpdated, ver))
		}
		if note.Deleted {
			want = append(want, fmt.Sprintf("%s %d", evDeleted, last+1))
		}
		evs := noteEvents[note.ID]
		sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
		var got []string
		for _, e := range evs {
			got = append(got, fmt.Sprintf("%s %d", e.Type, e.Data.Version))
		}
		if !slices.Equal(got, want) {
			v.fail("a note's events are its versions, contiguous, in commit order", "note %s: outbox %v, want %v", note.ID, got, want)
		} else {
			for i := 1; i < last; i++ {
				checkUpdatedEvent(v, evs[i], ups[i-1], states[i])
			}
		}
		var inStream []string
		for _, m := range streamByNote[note.ID] {
			inStream = append(inStream, fmt.Sprintf("%s %d", strings.TrimSuffix(strings.TrimPrefix(m.Type, "quill."), ".v1"), m.Version))
		}
		if !slices.Equal(inStream, want) {
			v.fail("a note's stream order is its version order", "note %s: stream %v, want %v", note.ID, inStream, want)
		}
	}
	return tally
}

// checkUpdatedEvent checks the note.updated of the accepted update u
// against the version before, prev: its key, and the fields it carries
// exactly those that changed, with their new values.
func checkUpdatedEvent(v *verdict, e eventRow, u acceptedUpdate, prev noteBody) {
	d := e.Data
	changed := func(field *string, now, before string) bool {
		if now == before {
			return field == nil
		}
		return field != nil && *field == now
	}
	if e.OpKey != u.o.Key || d.ID != u.n.ID || d.UpdatedAt != u.n.UpdatedAt ||
		!changed(d.Title, u.n.Title, prev.Title) || !changed(d.Body, u.n.Body, prev.Body) {
		v.fail("a note.updated carries its update's key and exactly the fields it changed", "event %s (version %d, key %s): id %s title %v body %v updated_at %s; update %s answered %q %q %s, before %q %q",
			e.ID, d.Version, e.OpKey, d.ID, strPtr(d.Title), strPtr(d.Body), d.UpdatedAt, u.o.Key, u.n.Title, u.n.Body, u.n.UpdatedAt, prev.Title, prev.Body)
	}
}

func strPtr(p *string) string {
	if p == nil {
		return "(absent)"
	}
	return fmt.Sprintf("%q", *p)
}

func eventList(es []eventRow) string {
	var out []string
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s v%d of %s", e.Type, e.Data.Version, e.Aggregate))
	}
	return "[" + strings.Join(out, ", ") + "]"
}
