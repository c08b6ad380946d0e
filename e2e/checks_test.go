package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/quillhq/quill/internal/wait"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/internal/eventschema"
)

// verdict collects failed invariants by check, with a few examples each.
type verdict struct {
	mu     sync.Mutex
	counts map[string]int
	ex     map[string][]string
	order  []string
}

func newVerdict() *verdict { return &verdict{counts: map[string]int{}, ex: map[string][]string{}} }

func (v *verdict) fail(check, format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.counts[check] == 0 {
		v.order = append(v.order, check)
	}
	v.counts[check]++
	if len(v.ex[check]) < 8 {
		v.ex[check] = append(v.ex[check], fmt.Sprintf(format, args...))
	}
}

// Report fails t once per failed check.
func (v *verdict) Report(t *testing.T) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, c := range v.order {
		t.Errorf("INVARIANT %s: %d violation(s), e.g.:\n    %s", c, v.counts[c], strings.Join(v.ex[c], "\n    "))
	}
}

func (v *verdict) Failed() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.order)
}

// --- the final state ---------------------------------------------------------

type noteRow struct {
	ID, Tenant, Title, Body string
	Deleted                 bool
	Version                 int
	// UpdatedAt is zero for a note written before versions (NULL).
	CreatedAt, UpdatedAt time.Time
}

type attRow struct {
	ID, NoteID, Status, Reason, SHA string
	Result                          []byte
	Thumb                           bool
}

type eventRow struct {
	Seq                                int64
	ID, Tenant, OpKey, Aggregate, Type string
	Published, Parked                  bool
	StreamSeq                          int64
	AttachmentID, State                string // attachment.processed data
	// Data is the note event's data (note.created, note.updated,
	// note.deleted).
	Data noteEventData
	// SchemaErr is why the payload does not match its type's schema
	// (internal/eventschema); empty when it does.
	SchemaErr string
}

// noteEventData is the part of a note event's data the checks read:
// data.version (0: none), and for a note.updated the fields it changed
// (nil: absent).
type noteEventData struct {
	ID        string  `json:"id"`
	Version   int     `json:"version"`
	Title     *string `json:"title"`
	Body      *string `json:"body"`
	UpdatedAt string  `json:"updated_at"`
	DeletedAt string  `json:"deleted_at"`
}

type opRow struct {
	Tenant, Key, Action, Resource string
	Status                        int
	Outcome                       string
	ResourceVersion               int // 0: NULL
}

type streamMsg struct {
	Seq                      uint64
	Subject, MsgID           string
	ID, Type, Source, NoteID string
	AttachmentID, State      string
	Version                  int // data.version (0: none)
	// SchemaErr is why the message does not match its type's schema
	// (internal/eventschema); empty when it does.
	SchemaErr string
}

// finalState is everything the checks read after the drain.
type finalState struct {
	notes      []noteRow
	atts       []attRow
	events     []eventRow
	ops        []opRow
	inbox      map[string]bool // event ids the worker's consumer recorded
	deadLetter []string
	stream     []streamMsg
	lookups    map[string]lookup // tenant/key → lookup
}

func loadState(ctx context.Context, dbURL, consumer string) (*finalState, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	st := &finalState{inbox: map[string]bool{}}
	collect := func(sql string, scan func(pgx.Rows) error, args ...any) error {
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	if err := collect(`SELECT id::text, tenant, title, body, deleted_at IS NOT NULL, version, created_at, updated_at FROM notes`, func(r pgx.Rows) error {
		var n noteRow
		var updated *time.Time
		err := r.Scan(&n.ID, &n.Tenant, &n.Title, &n.Body, &n.Deleted, &n.Version, &n.CreatedAt, &updated)
		if updated != nil {
			n.UpdatedAt = *updated
		}
		st.notes = append(st.notes, n)
		return err
	}); err != nil {
		return nil, err
	}
	if err := collect(`SELECT id::text, note_id::text, status, coalesce(reason, ''), sha256, coalesce(result::text, ''), thumbnail IS NOT NULL FROM attachments`, func(r pgx.Rows) error {
		var a attRow
		var res string
		err := r.Scan(&a.ID, &a.NoteID, &a.Status, &a.Reason, &a.SHA, &res, &a.Thumb)
		a.Result = []byte(res)
		st.atts = append(st.atts, a)
		return err
	}); err != nil {
		return nil, err
	}
	if err := collect(`SELECT seq, id::text, tenant, coalesce(operation_key, ''), aggregate_id::text, type,
		published_at IS NOT NULL, parked_at IS NOT NULL, coalesce(stream_seq, 0), payload FROM outbox_events`, func(r pgx.Rows) error {
		var e eventRow
		var payload []byte
		if err := r.Scan(&e.Seq, &e.ID, &e.Tenant, &e.OpKey, &e.Aggregate, &e.Type, &e.Published, &e.Parked, &e.StreamSeq, &payload); err != nil {
			return err
		}
		var ce struct {
			Data struct {
				AttachmentID string `json:"attachment_id"`
				State        string `json:"state"`
			} `json:"data"`
		}
		_ = json.Unmarshal(payload, &ce)
		e.AttachmentID, e.State = ce.Data.AttachmentID, ce.Data.State
		var nd struct {
			Data noteEventData `json:"data"`
		}
		_ = json.Unmarshal(payload, &nd)
		e.Data = nd.Data
		if err := eventschema.Validate(payload); err != nil {
			e.SchemaErr = err.Error()
		}
		st.events = append(st.events, e)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := collect(`SELECT tenant, key, action, coalesce(resource, ''), CASE outcome WHEN 'created' THEN 201
			WHEN 'deleted' THEN 200 WHEN 'updated' THEN 200 WHEN 'unchanged' THEN 200
			WHEN 'nothing_to_delete' THEN 404 WHEN 'nothing_to_update' THEN 404 WHEN 'version_mismatch' THEN 412 ELSE 0 END,
			coalesce(outcome, ''), coalesce(resource_version, 0) FROM operations`, func(r pgx.Rows) error {
		var o opRow
		err := r.Scan(&o.Tenant, &o.Key, &o.Action, &o.Resource, &o.Status, &o.Outcome, &o.ResourceVersion)
		st.ops = append(st.ops, o)
		return err
	}); err != nil {
		return nil, err
	}
	if err := collect(`SELECT event_id::text FROM quill_consumer_inbox WHERE consumer = $1`, func(r pgx.Rows) error {
		var id string
		err := r.Scan(&id)
		st.inbox[id] = true
		return err
	}, consumer); err != nil {
		return nil, err
	}
	if err := collect(`SELECT id::text || ' event ' || event_id || ': ' || reason FROM quill_consumer_dead_letters`, func(r pgx.Rows) error {
		var s string
		err := r.Scan(&s)
		st.deadLetter = append(st.deadLetter, s)
		return err
	}); err != nil {
		return nil, err
	}
	return st, nil
}

// readStream reads every message of the stream, with its Nats-Msg-Id. In
// a cluster the ordered consumer's first pull can find no responder — the
// new consumer's interest has not reached the node the reader is on yet
// (about 1 read in 100 on a quiet natstest cluster) — so such a read
// starts again with a new consumer.
func readStream(ctx context.Context, natsURL, stream string) ([]streamMsg, error) {
	for attempt := 1; ; attempt++ {
		msgs, err := readStreamOnce(ctx, natsURL, stream)
		if err == nil || !isNoResponders(err) || attempt == 5 {
			return msgs, err
		}
		if !wait.For(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

// isNoResponders reports a request that found no subscriber.
func isNoResponders(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) ||
		strings.Contains(err.Error(), "no responders")
}

func readStreamOnce(ctx context.Context, natsURL, stream string) ([]streamMsg, error) {
	nc, js, err := jetStreamAt(natsURL, "e2e-reader")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var out []streamMsg
	for {
		// The fetch's goroutine waits for the rest of its batch until its
		// context ends: ending it when this returns early, at the last
		// message, keeps the goroutine from outliving the read.
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		batch, err := cons.Fetch(1000, jetstream.FetchContext(fctx))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			var ce struct {
				ID, Type, Source, Subject string
				Data                      struct {
					AttachmentID string `json:"attachment_id"`
					State        string `json:"state"`
					Version      int    `json:"version"`
				} `json:"data"`
			}
			_ = json.Unmarshal(m.Data(), &ce)
			sm := streamMsg{Seq: meta.Sequence.Stream, Subject: m.Subject(), MsgID: m.Headers().Get(jetstream.MsgIDHeader),
				ID: ce.ID, Type: ce.Type, Source: ce.Source, NoteID: ce.Subject, AttachmentID: ce.Data.AttachmentID, State: ce.Data.State,
				Version: ce.Data.Version}
			if err := eventschema.Validate(m.Data()); err != nil {
				sm.SchemaErr = err.Error()
			}
			out = append(out, sm)
			if meta.Sequence.Stream >= last {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if n == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// lookup is GET /v1/operations/{key}'s answer.
type lookup struct {
	HTTP     int
	Code     string `json:"code"`
	State    string `json:"state"`
	Action   string `json:"action"`
	Response *struct {
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	} `json:"response"`
	Effects []struct {
		Kind      string `json:"kind"`
		ID        string `json:"id"`
		Type      string `json:"type"`
		State     string `json:"state"`
		StreamSeq *int64 `json:"stream_seq"`
	} `json:"effects"`
	Err string
}

// lookupAll asks the API (directly, not through the proxy) what became of
// every operation.
func lookupAll(ctx context.Context, apiURL string, ops []*op) map[string]lookup {
	client := &http.Client{Timeout: 30 * time.Second}
	out := make(map[string]lookup, len(ops))
	var mu sync.Mutex
	work := make(chan *op)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for o := range work {
				var l lookup
				for attempt := 0; attempt < 5; attempt++ {
					l = lookupOne(ctx, client, apiURL, o)
					if l.Err == "" && l.HTTP != http.StatusServiceUnavailable {
						break
					}
					wait.For(ctx, time.Second)
				}
				mu.Lock()
				out[o.Tenant+"/"+o.Key] = l
				mu.Unlock()
			}
		})
	}
	for _, o := range ops {
		work <- o
	}
	close(work)
	wg.Wait()
	return out
}

func lookupOne(ctx context.Context, client *http.Client, apiURL string, o *op) lookup {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/v1/operations/"+url.PathEscape(o.Key), nil)
	req.Header.Set("Authorization", "Bearer "+o.token)
	resp, err := client.Do(req)
	if err != nil {
		return lookup{Err: err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return lookup{Err: err.Error()}
	}
	l := lookup{}
	if err := json.Unmarshal(b, &l); err != nil {
		return lookup{HTTP: resp.StatusCode, Err: "lookup body: " + err.Error()}
	}
	l.HTTP = resp.StatusCode
	return l
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// resolution is an operation's final outcome: what a decided answer said,
// or — for an operation no request got an answer for — what the lookup
// established afterwards.
type resolution struct {
	executed bool // the operation is recorded (completed)
	status   int
	body     []byte
	unknown  bool // the client never got a decided answer
}

// outcomeTally counts what operations resolved to.
type outcomeTally struct {
	Decided, UnknownExecuted, UnknownNotExecuted, Unresolved int
	Edits                                                    editTally
}

// checkAll verifies the invariants of the final state against the
// operations the clients ran; it returns the resolutions.
func checkAll(v *verdict, ops []*op, st *finalState, consumer, prefix string) (map[*op]resolution, outcomeTally) {
	res := map[*op]resolution{}
	var tally outcomeTally

	// A. What the clients were told, per operation.
	for _, o := range ops {
		o.mu.Lock()
		decided := append([]answer(nil), o.decided...)
		o.mu.Unlock()
		if len(decided) == 0 {
			continue
		}
		first, fresh := decided[0], 0
		for _, a := range decided {
			if a.Status != first.Status || a.ETag != first.ETag || string(a.Body) != string(first.Body) {
				v.fail("replays answer byte for byte", "%s %s: %d ETag %s %s vs %d ETag %s %s", o.Kind, o.Key, first.Status, first.ETag, first.Body, a.Status, a.ETag, a.Body)
			}
			if !a.Replayed {
				fresh++
			}
		}
		if fresh > 1 {
			v.fail("one execution per key", "%s %s: %d answers without Idempotent-Replayed", o.Kind, o.Key, fresh)
		}
		switch {
		case o.Kind == opCreate && (first.Status != http.StatusCreated || first.ETag != etagOf(1)):
			v.fail("creates answer 201 with ETag \"1\"", "%s: %d ETag %q %s", o.Key, first.Status, first.ETag, first.Body)
		case o.Kind == opDelete && first.Status != o.ExpectStatus:
			v.fail("deletes answer 200 for a live note, 404 for a deleted one", "%s on note %s: want %d, got %d %s", o.Key, o.NoteID, o.ExpectStatus, first.Status, first.Body)
		}
	}

	// B. The lookup: completed with the answer given, or — for unknown
	// outcomes — completed or never executed, nothing in between.
	for _, o := range ops {
		l := st.lookups[o.Tenant+"/"+o.Key]
		d := o.Decided()
		switch {
		case l.Err != "":
			v.fail("lookup answers", "%s: %s", o.Key, l.Err)
			tally.Unresolved++
		case l.HTTP == http.StatusOK && l.State == "completed" && l.Response != nil:
			r := resolution{executed: true, status: l.Response.Status, body: l.Response.Body, unknown: d == nil}
			if d != nil {
				tally.Decided++
				if d.Status != l.Response.Status || !jsonEqual(d.Body, l.Response.Body) {
					v.fail("lookup matches the answer", "%s: answered %d %s, lookup %d %s", o.Key, d.Status, d.Body, l.Response.Status, l.Response.Body)
				}
			} else {
				tally.UnknownExecuted++
				if o.Kind == opCreate && r.status == http.StatusCreated {
					o.mu.Lock()
					o.NoteID = noteIDOf(r.body)
					o.mu.Unlock()
				}
			}
			for _, e := range l.Effects {
				if e.Kind == "event" && e.State != "published" {
					v.fail("lookup effects settled", "%s: event %s %s is %s", o.Key, e.Type, e.ID, e.State)
				}
			}
			res[o] = r
		case l.HTTP == http.StatusNotFound && l.Code == "operation_not_found" && d == nil:
			tally.UnknownNotExecuted++
			res[o] = resolution{unknown: true}
		default:
			v.fail("lookup is completed or not found", "%s (decided %v): HTTP %d state %q code %q", o.Key, d != nil, l.HTTP, l.State, l.Code)
			tally.Unresolved++
		}
	}

	// C. One note per create key; none for a create that never executed;
	// no note the clients did not ask for.
	notesByTitle := map[string][]noteRow{}
	notesByID := map[string]noteRow{}
	for _, n := range st.notes {
		t := createTitleOf(n.Title)
		notesByTitle[t] = append(notesByTitle[t], n)
		notesByID[n.ID] = n
	}
	createByTitle := map[string]*op{}
	completedCreates := 0
	for _, o := range ops {
		if o.Kind != opCreate {
			continue
		}
		createByTitle[o.Title] = o
		r, ok := res[o]
		if !ok {
			continue
		}
		got := notesByTitle[o.Title]
		switch {
		case r.executed && r.status == http.StatusCreated:
			completedCreates++
			if len(got) != 1 {
				v.fail("one note per create key", "%s: %d notes", o.Key, len(got))
				continue
			}
			if id := noteIDOf(r.body); got[0].ID != id || got[0].Tenant != o.Tenant {
				v.fail("the answered note is the stored one", "%s: answered %s, stored %s (tenant %s)", o.Key, id, got[0].ID, got[0].Tenant)
			}
		case !r.executed && len(got) != 0:
			v.fail("no note for a create that never executed", "%s: lookup 404 but %d notes", o.Key, len(got))
		}
	}
	for title, ns := range notesByTitle {
		if createByTitle[title] == nil {
			v.fail("no stray notes", "note %s %q belongs to no operation of the run", ns[0].ID, title)
		}
	}
	if completedCreates != len(st.notes) {
		v.fail("notes = completed creates", "%d notes, %d completed create operations", len(st.notes), completedCreates)
	}
	createOps := 0
	for _, r := range st.ops {
		if r.Action == "create-note" {
			createOps++
		}
	}
	if createOps != len(st.notes) {
		v.fail("operation records = notes", "%d create-note records, %d notes", createOps, len(st.notes))
	}

	// D. A deleted note was deleted once: by exactly one operation that
	// answered 200; a note that is live was deleted by none.
	deletesOK := map[string]int{}
	for _, o := range ops {
		r, ok := res[o]
		if o.Kind != opDelete || !ok || !r.executed {
			continue
		}
		if r.status == http.StatusOK {
			deletesOK[o.NoteID]++
		}
		n, found := notesByID[o.NoteID]
		switch {
		case !found:
			v.fail("deletes target notes of the run", "%s: note %s not found", o.Key, o.NoteID)
		case r.status == http.StatusOK && !n.Deleted:
			v.fail("a 200 delete deleted the note", "%s: note %s is live", o.Key, o.NoteID)
		case r.status == http.StatusNotFound && !n.Deleted:
			v.fail("a 404 delete names a deleted note", "%s: note %s is live", o.Key, o.NoteID)
		}
	}
	for _, n := range st.notes {
		if n.Deleted && deletesOK[n.ID] != 1 {
			v.fail("a deleted note was deleted once", "note %s: %d delete operations answered 200", n.ID, deletesOK[n.ID])
		}
		if !n.Deleted && deletesOK[n.ID] != 0 {
			v.fail("a deleted note was deleted once", "live note %s: %d delete operations answered 200", n.ID, deletesOK[n.ID])
		}
	}

	// E. The outbox: every event published, none parked; one note.created
	// per note (with its create's key), one note.deleted per deleted note,
	// one attachment.processed per processed or failed attachment.
	type perNote struct{ created, deleted, processed int }
	byNote := map[string]*perNote{}
	processedByAtt := map[string]int{}
	eventByID := map[string]eventRow{}
	createdEvent := map[string]eventRow{} // note id → its note.created
	for _, e := range st.events {
		eventByID[e.ID] = e
		if e.SchemaErr != "" {
			v.fail("every event matches its schema", "outbox: %s", e.SchemaErr)
		}
		if !e.Published {
			v.fail("every event published", "%s %s (note %s) unpublished, parked %t", e.Type, e.ID, e.Aggregate, e.Parked)
		}
		p := byNote[e.Aggregate]
		if p == nil {
			p = &perNote{}
			byNote[e.Aggregate] = p
		}
		switch e.Type {
		case "note.created":
			p.created++
			createdEvent[e.Aggregate] = e
		case "note.deleted":
			p.deleted++
		case "note.updated":
		case "attachment.processed":
			p.processed++
			processedByAtt[e.AttachmentID]++
		default:
			v.fail("known event types", "%s %s", e.Type, e.ID)
		}
	}
	for _, n := range st.notes {
		p := byNote[n.ID]
		if p == nil {
			p = &perNote{}
		}
		if p.created != 1 {
			v.fail("one note.created per note", "note %s: %d", n.ID, p.created)
		} else if o := createByTitle[n.Title]; o != nil && createdEvent[n.ID].OpKey != o.Key {
			v.fail("note.created carries its operation key", "note %s: %q, want %q", n.ID, createdEvent[n.ID].OpKey, o.Key)
		}
		if want := map[bool]int{true: 1, false: 0}[n.Deleted]; p.deleted != want {
			v.fail("one note.deleted per deleted note", "note %s (deleted %t): %d", n.ID, n.Deleted, p.deleted)
		}
	}

	// F. Attachments: processed once (one attachment.processed), with the
	// right result; pending only when the note was deleted first.
	attByNote := map[string]attRow{}
	for _, a := range st.atts {
		attByNote[a.NoteID] = a
		n := notesByID[a.NoteID]
		switch a.Status {
		case "processed", "failed":
			if processedByAtt[a.ID] != 1 {
				v.fail("one attachment.processed per processed attachment", "attachment %s: %d", a.ID, processedByAtt[a.ID])
			}
			if a.Status == "failed" {
				v.fail("valid attachments do not fail", "attachment %s of note %s: %s", a.ID, a.NoteID, a.Reason)
			}
		case "pending":
			if processedByAtt[a.ID] != 0 {
				v.fail("one attachment.processed per processed attachment", "pending attachment %s: %d", a.ID, processedByAtt[a.ID])
			}
			if !n.Deleted || !strings.HasPrefix(a.Reason, "skipped") {
				v.fail("every attachment processed (or skipped for a deleted note)", "attachment %s of note %s: pending, deleted %t, reason %q", a.ID, a.NoteID, n.Deleted, a.Reason)
			}
		}
	}
	for _, o := range ops {
		r, ok := res[o]
		if o.Kind != opCreate || !ok || !r.executed || o.Att == attNone {
			continue
		}
		id := noteIDOf(r.body)
		a, found := attByNote[id]
		if !found {
			v.fail("the attachment is stored", "%s: note %s has no attachment", o.Key, id)
			continue
		}
		if a.SHA != o.AttSHA {
			v.fail("the attachment is stored", "%s: sha256 %s, sent %s", o.Key, a.SHA, o.AttSHA)
		}
		if a.Status != "processed" {
			continue
		}
		var result struct {
			DetectedType string `json:"detected_type"`
			Thumbnail    *struct {
				Width, Height int
			} `json:"thumbnail"`
			Text *struct {
				Lines, Words int
			} `json:"text"`
		}
		_ = json.Unmarshal(a.Result, &result)
		switch o.Att {
		case attPNG:
			if result.DetectedType != "image/png" || result.Thumbnail == nil || !a.Thumb {
				v.fail("the attachment's result is right", "%s (png): %s", o.Key, a.Result)
			}
		case attText:
			if !strings.HasPrefix(result.DetectedType, "text/plain") || result.Text == nil ||
				result.Text.Lines != o.Lines || result.Text.Words != o.Words {
				v.fail("the attachment's result is right", "%s (text, %d lines, %d words): %s", o.Key, o.Lines, o.Words, a.Result)
			}
		}
	}

	// G. The inbox: one row per note.created event with an attachment, and
	// none for anything else.
	withAtt := map[string]bool{}
	for noteID, e := range createdEvent {
		if _, ok := attByNote[noteID]; ok {
			withAtt[e.ID] = true
			if !st.inbox[e.ID] {
				v.fail("every note.created with an attachment is in the inbox", "event %s (note %s)", e.ID, noteID)
			}
		}
	}
	for id := range st.inbox {
		if !withAtt[id] {
			v.fail("the inbox holds only note.created events with attachments", "event %s", id)
		}
	}

	// H. The stream: every outbox event exactly once, under its id, on its
	// subject, at the sequence the outbox recorded, each note's events in
	// commit order.
	seen := map[string]int{}
	streamSeq := map[string]uint64{}
	for _, m := range st.stream {
		seen[m.ID]++
		streamSeq[m.ID] = m.Seq
		if m.SchemaErr != "" {
			v.fail("every event matches its schema", "stream seq %d: %s", m.Seq, m.SchemaErr)
		}
		if m.MsgID != m.ID {
			v.fail("Nats-Msg-Id is the event id", "stream seq %d: header %q, id %q", m.Seq, m.MsgID, m.ID)
		}
		e, ok := eventByID[m.ID]
		if !ok {
			v.fail("the stream holds only outbox events", "stream seq %d: event %s %s", m.Seq, m.Type, m.ID)
			continue
		}
		if want := prefix + "." + e.Tenant + "." + e.Type; m.Subject != want {
			v.fail("events go to their subject", "event %s: %s, want %s", m.ID, m.Subject, want)
		}
		if uint64(e.StreamSeq) != m.Seq {
			v.fail("the outbox records the stream sequence", "event %s: outbox %d, stream %d", m.ID, e.StreamSeq, m.Seq)
		}
	}
	for id, n := range seen {
		if n != 1 {
			v.fail("every event in the stream once", "event %s (%s): %d times", id, eventByID[id].Type, n)
		}
	}
	for _, e := range st.events {
		if seen[e.ID] == 0 {
			v.fail("every event in the stream once", "event %s (%s, note %s): missing", e.ID, e.Type, e.Aggregate)
		}
	}
	byAgg := map[string][]eventRow{}
	for _, e := range st.events {
		byAgg[e.Aggregate] = append(byAgg[e.Aggregate], e)
	}
	for agg, es := range byAgg {
		sort.Slice(es, func(i, j int) bool { return es[i].Seq < es[j].Seq })
		for i := 1; i < len(es); i++ {
			if streamSeq[es[i].ID] < streamSeq[es[i-1].ID] {
				v.fail("a note's events in commit order", "note %s: %s (stream %d) before %s (stream %d)", agg,
					es[i].Type, streamSeq[es[i].ID], es[i-1].Type, streamSeq[es[i-1].ID])
			}
		}
	}

	// I. No dead letters: every event could be processed.
	for _, d := range st.deadLetter {
		v.fail("no dead letters", "%s", d)
	}

	// J–L. Edits: every update's one outcome, each note's versions, the
	// races (editchecks_test.go).
	tally.Edits = checkEdits(v, ops, st, res, createByTitle)
	return res, tally
}

// createTitleOf is the title of the create behind a note's title: an
// update sets "<the create's title> · edit …" (newUpdate).
func createTitleOf(title string) string {
	t, _, _ := strings.Cut(title, " · ")
	return t
}
