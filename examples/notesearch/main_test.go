package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/examples/notesearch/projection"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/outbox"
)

// TestMain fails the package if the service leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	waitLong = 60 * time.Second
	tick     = 10 * time.Millisecond
	// The test's stream: a prefix other than the default, to show the
	// setting is honoured, and a duplicate window short enough to wait past.
	testStream  = "NOTES_EVENTS"
	testPrefix  = "qt"
	testDurable = "notesearch-test"
	dupWindow   = time.Second
)

// world is one test's Quill stream, notesearch's own schema behind a proxy
// that can lose a COMMIT's reply, and the notes that should exist.
type world struct {
	t     *testing.T
	js    jetstream.JetStream
	db    *pgxpool.Pool // straight to the schema, for the assertions
	dbURL string        // through the proxy, for the service
	proxy *dbtest.Proxy
	nats  string

	published []published      // every message published, in order
	want      map[string]*note // by tenant/note id: the notes as Quill has them
}

type published struct {
	subject, id string
	payload     []byte
}

// note is what the projection should hold of one note.
type note struct {
	tenant, id, title string
	bodyLen           int
	createdAt         time.Time
	deletedAt         time.Time // zero while live
}

func setup(t *testing.T) *world {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: testStream, Subjects: []string{testPrefix + ".>"}, Storage: jetstream.FileStorage, Duplicates: dupWindow,
	})
	require.NoError(t, err)
	schema := dbtest.EmptySchema(t)
	db, err := pgxpool.New(t.Context(), schema)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	proxy, proxied := dbtest.NewProxy(t, schema)
	return &world{t: t, js: js, db: db, dbURL: proxied, proxy: proxy, nats: srv.URL(), want: map[string]*note{}}
}

// publish publishes e the way Quill's relay does — the outbox's envelope,
// Nats-Msg-Id the event id, subject <prefix>.<tenant>.<type> — and
// remembers it.
func (w *world) publish(e outbox.Event) {
	w.t.Helper()
	payload, err := outbox.Envelope(e)
	require.NoError(w.t, err)
	p := published{subject: testPrefix + "." + e.Tenant + "." + e.Type, id: e.ID.String(), payload: payload}
	require.False(w.t, w.send(p).Duplicate, "a new event is not a duplicate")
	w.published = append(w.published, p)
}

func (w *world) send(p published) *jetstream.PubAck {
	w.t.Helper()
	m := nats.NewMsg(p.subject)
	m.Data = p.payload
	m.Header.Set(nats.MsgIdHdr, p.id)
	m.Header.Set("Content-Type", "application/cloudevents+json")
	ack, err := w.js.PublishMsg(w.t.Context(), m)
	require.NoError(w.t, err)
	return ack
}

// createdData and deletedData are the events' data as Quill writes them.
type createdData struct {
	ID         string `json:"id"`
	Title      string `json:"title"`
	Body       string `json:"body"`
	CreatedAt  string `json:"created_at"`
	Attachment any    `json:"attachment"`
}

type deletedData struct {
	ID        string `json:"id"`
	DeletedAt string `json:"deleted_at"`
}

// create publishes the note.created of a new note of tenant and returns it.
func (w *world) create(tenant, title, body string) *note {
	n := &note{tenant: tenant, id: uuid.Must(uuid.NewV7()).String(), title: title, bodyLen: len([]rune(body)),
		createdAt: time.Now().UTC().Truncate(time.Microsecond)}
	w.want[tenant+"/"+n.id] = n
	w.publishCreated(n, body)
	return n
}

func (w *world) publishCreated(n *note, body string) {
	w.publish(outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: n.tenant, AggregateID: uuid.MustParse(n.id),
		Type: contract.EventNoteCreated, Time: n.createdAt,
		Data: createdData{ID: n.id, Title: n.title, Body: body, CreatedAt: n.createdAt.Format(outbox.TimeFormat)}})
}

// remove publishes n's note.deleted.
func (w *world) remove(n *note) {
	n.deletedAt = time.Now().UTC().Truncate(time.Microsecond)
	w.publish(outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: n.tenant, AggregateID: uuid.MustParse(n.id),
		Type: contract.EventNoteDeleted, Time: n.deletedAt,
		Data: deletedData{ID: n.id, DeletedAt: n.deletedAt.Format(outbox.TimeFormat)}})
}

// start runs notesearch against the world, as its main would, until the
// returned stop cancels its context; stop returns run's error.
func (w *world) start(name string) (stop func() error) {
	t := w.t
	env := map[string]string{
		"DATABASE_URL":                w.dbURL,
		"NATS_URL":                    w.nats,
		"QUILL_STREAM":                testStream,
		"QUILL_SUBJECT_PREFIX":        testPrefix,
		"NOTESEARCH_DURABLE":          testDurable,
		"NOTESEARCH_ACK_WAIT":         "1s",
		"NOTESEARCH_SHUTDOWN_TIMEOUT": "1ms", // a kill: running handlers are cancelled, not finished
	}
	p := clitest.Start(t, run, clitest.Env(env))
	var logged sync.Once
	stop = func() error {
		err := p.Stop()
		logged.Do(func() {
			if t.Failed() || err != nil {
				t.Logf("%s's log:\n%s", name, p.Stderr.String())
			}
		})
		return err
	}
	t.Cleanup(func() { assert.NoError(t, stop()) })
	return stop
}

func (w *world) count(sql string, args ...any) int {
	w.t.Helper()
	var n int
	require.NoError(w.t, w.db.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

const sqlInboxed = `SELECT count(*) FROM quill_consumer_inbox WHERE consumer = $1`

// inboxed is how many events the service has committed.
func (w *world) inboxed() int {
	return w.count(sqlInboxed, testDurable)
}

// waitInboxed waits until at least n events are committed. Until the
// service has migrated its schema there is no inbox to count.
func (w *world) waitInboxed(n int) {
	w.t.Helper()
	require.Eventually(w.t, func() bool {
		var got int
		err := w.db.QueryRow(context.Background(), sqlInboxed, testDurable).Scan(&got)
		return err == nil && got >= n
	}, waitLong, tick, "events committed never reached %d", n)
}

// waitDrained waits until the durable consumer has acknowledged every
// message of the stream.
func (w *world) waitDrained() {
	w.t.Helper()
	require.EventuallyWithT(w.t, func(c *assert.CollectT) {
		st, err := w.js.Stream(context.Background(), testStream)
		if !assert.NoError(c, err) {
			return
		}
		cons, err := st.Consumer(context.Background(), testDurable)
		if !assert.NoError(c, err) {
			return
		}
		info, err := cons.Info(context.Background())
		if !assert.NoError(c, err) {
			return
		}
		assert.Equal(c, st.CachedInfo().State.LastSeq, info.AckFloor.Stream, "acknowledged up to the stream's end")
		assert.Zero(c, info.NumAckPending, "unacknowledged")
	}, waitLong, tick)
}

// row is a projection row with comparable times.
type row struct {
	Tenant, ID, Title              string
	Live                           bool
	BodyLength                     int
	CreatedAt, DeletedAt           string
	CreatedApplied, DeletedApplied int
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(outbox.TimeFormat)
}

// TestConvergesAfterKillRepublishAndRedelivery runs the service over a
// stream of two tenants' creates and deletes, kills it mid-stream right
// after a commit whose reply was lost (committed, never acknowledged),
// publishes more events and republishes every earlier one past the
// duplicate window while it is down, restarts it, and checks that its
// projection is exactly the notes that exist, each event applied once.
func TestConvergesAfterKillRepublishAndRedelivery(t *testing.T) {
	t.Parallel()
	w := setup(t)
	tenants := []string{"acme", "globex"}

	// Phase 1a: some notes, a third of them deleted, and one note per
	// tenant whose delete reaches the stream before its create (as a
	// create Nak'ed behind its delete would reach a consumer).
	var notes []*note
	for _, tenant := range tenants {
		for i := range 15 {
			n := w.create(tenant, fmt.Sprintf("groceries %s %d", tenant, i), strings.Repeat("é", i))
			notes = append(notes, n)
			if i%3 == 0 {
				w.remove(n)
			}
		}
		late := &note{tenant: tenant, id: uuid.Must(uuid.NewV7()).String(), title: "late " + tenant, bodyLen: 4,
			createdAt: time.Now().UTC().Truncate(time.Microsecond)}
		w.want[tenant+"/"+late.id] = late
		w.remove(late)
		w.publishCreated(late, "body")
	}
	first := len(w.published)
	stop := w.start("notesearch (1)")
	w.waitInboxed(first)

	// Phase 1b: many more events; the first commit among them loses its
	// reply, and the service is killed right then, mid-stream.
	w.proxy.LoseNextReply()
	for _, tenant := range tenants {
		for i := range 60 {
			n := w.create(tenant, fmt.Sprintf("notes %s %d", tenant, i), "b")
			notes = append(notes, n)
			if i%4 == 0 {
				w.remove(n)
			}
		}
	}
	require.Eventually(t, func() bool { return w.proxy.Cuts() >= 1 }, waitLong, time.Millisecond, "no commit reply was lost")
	require.NoError(t, stop())
	atKill := w.inboxed()
	t.Logf("killed with %d of %d events committed", atKill, len(w.published))

	// Phase 2, while it is down: new notes, deletes of live ones, and
	// every event so far published again past the duplicate window, so
	// that the stream takes each as a new message.
	for _, tenant := range tenants {
		for i := range 5 {
			w.create(tenant, fmt.Sprintf("later %s %d", tenant, i), "")
		}
	}
	for _, n := range notes {
		if n.deletedAt.IsZero() && len(n.title)%2 == 0 {
			w.remove(n)
		}
	}
	again := slices.Clone(w.published)
	for _, p := range again {
		// The window counts from the first publication: until it has
		// passed, JetStream drops the copy, which is harmless.
		require.Eventually(t, func() bool { return !w.send(p).Duplicate }, waitLong, 50*time.Millisecond,
			"event %s still a duplicate", p.id)
	}
	distinct := len(w.published)

	// Phase 3: restart; it redelivers what was not acknowledged and the
	// copies.
	stop = w.start("notesearch (2)")
	w.waitDrained()
	require.NoError(t, stop())

	assert.Equal(t, distinct, w.inboxed(), "inbox rows = distinct event ids")
	assert.Zero(t, w.count(`SELECT count(*) FROM quill_consumer_dead_letters`), "dead letters")

	var want []row
	for _, n := range w.want {
		r := row{Tenant: n.tenant, ID: n.id, Live: n.deletedAt.IsZero(), CreatedAt: n.createdAt.Format(outbox.TimeFormat), CreatedApplied: 1}
		if r.Live {
			r.Title, r.BodyLength = n.title, n.bodyLen
		} else {
			r.DeletedAt, r.DeletedApplied = n.deletedAt.Format(outbox.TimeFormat), 1
		}
		want = append(want, r)
	}
	got, err := projection.List(t.Context(), w.db)
	require.NoError(t, err)
	var have []row
	for _, n := range got {
		r := row{Tenant: n.Tenant, ID: n.ID, Live: !n.Deleted(), CreatedAt: fmtTime(n.CreatedAt), DeletedAt: fmtTime(n.DeletedAt),
			CreatedApplied: n.CreatedApplied, DeletedApplied: n.DeletedApplied}
		if n.Title != nil {
			r.Title = *n.Title
		}
		if n.BodyLength != nil {
			r.BodyLength = *n.BodyLength
		}
		have = append(have, r)
	}
	cmpRows := func(a, b row) int { return strings.Compare(a.Tenant+a.ID, b.Tenant+b.ID) }
	slices.SortFunc(want, cmpRows)
	slices.SortFunc(have, cmpRows)
	require.Equal(t, want, have, "the projection is the notes as Quill has them, each event applied once")

	// And it answers searches: acme's live groceries notes, no tombstone.
	found, err := projection.Search(t.Context(), w.db, "acme", "groceries", 100)
	require.NoError(t, err)
	var live int
	for _, n := range w.want {
		if n.tenant == "acme" && strings.HasPrefix(n.title, "groceries") && n.deletedAt.IsZero() {
			live++
		}
	}
	assert.Len(t, found, live)
}

// publishNote publishes an event of n's of type typ with data, as the
// relay does, and returns its id.
func (w *world) publishNote(n *note, typ string, at time.Time, data map[string]any) string {
	w.t.Helper()
	id := uuid.Must(uuid.NewV7())
	w.publish(outbox.Event{ID: id, Tenant: n.tenant, AggregateID: uuid.MustParse(n.id), Type: typ, Time: at, Data: data})
	return id.String()
}

// inboxDeliveries is the delivery that committed event id, 0 while none
// did (or the service has not made its inbox yet).
func (w *world) inboxDeliveries(id string) int {
	var n int
	err := w.db.QueryRow(context.Background(), `SELECT coalesce(max(deliveries), 0) FROM quill_consumer_inbox WHERE consumer = $1 AND event_id = $2`,
		testDurable, id).Scan(&n)
	if err != nil {
		return 0
	}
	return n
}

func (w *world) waitApplied(ids ...string) {
	w.t.Helper()
	for _, id := range ids {
		require.Eventually(w.t, func() bool { return w.inboxDeliveries(id) > 0 }, waitLong, tick, "event %s never committed", id)
	}
}

// projected is the projection's row of n.
func (w *world) projected(n *note) projection.Note {
	w.t.Helper()
	all, err := projection.List(w.t.Context(), w.db)
	require.NoError(w.t, err)
	for _, p := range all {
		if p.Tenant == n.tenant && p.ID == n.id {
			return p
		}
	}
	w.t.Fatalf("no row for note %s", n.id)
	return projection.Note{}
}

// TestUpdatesApplyInVersionOrder runs the service over one note's
// versioned events: updates apply in order, each changing only its
// fields; a copy of an older update that the inbox no longer knows is
// skipped as stale; an update that reaches the service before the one it
// follows is held back and applied after it; a delete ends it. No field
// of any update is lost.
func TestUpdatesApplyInVersionOrder(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.start("notesearch")
	now := time.Now().UTC().Truncate(time.Microsecond)
	ts := now.Format(outbox.TimeFormat)
	n := &note{tenant: "acme", id: uuid.Must(uuid.NewV7()).String(), createdAt: now}
	version := int64(0)
	update := func(fields map[string]any) string {
		version++
		data := map[string]any{"id": n.id, "version": version, "updated_at": ts}
		maps.Copy(data, fields)
		return w.publishNote(n, contract.EventNoteUpdated, now, data)
	}
	check := func(title string, bodyLen int, v int64, updates int) {
		t.Helper()
		got := w.projected(n)
		require.NotNil(t, got.Title)
		require.NotNil(t, got.BodyLength)
		require.NotNil(t, got.Version)
		require.Equal(t, [4]any{title, bodyLen, v, updates}, [4]any{*got.Title, *got.BodyLength, *got.Version, got.UpdatedApplied})
	}

	// In order: each update changes only its fields.
	version = 1
	created := w.publishNote(n, contract.EventNoteCreated, now, map[string]any{"id": n.id, "title": "Groceries", "body": "milk",
		"created_at": ts, "attachment": nil, "version": 1, "updated_at": ts})
	shopping := update(map[string]any{"title": "Shopping"})
	body := update(map[string]any{"body": "milk, eggs"})
	weekly := update(map[string]any{"title": "Weekly shopping"})
	w.waitApplied(created, shopping, body, weekly)
	check("Weekly shopping", 10, 4, 3)

	// A copy of version 2 beyond the inbox's memory (its row gone, the
	// duplicate window past): skipped as stale, the title stays.
	_, err := w.db.Exec(t.Context(), `DELETE FROM quill_consumer_inbox WHERE event_id = $1`, shopping)
	require.NoError(t, err)
	old := w.published[1]
	require.Equal(t, shopping, old.id)
	require.Eventually(t, func() bool { return !w.send(old).Duplicate }, waitLong, 50*time.Millisecond, "still a duplicate")
	w.waitApplied(shopping)
	check("Weekly shopping", 10, 4, 3)

	// Version 6 reaches the service before version 5: held back (the
	// service's queue for the note gives it the first turn), then applied
	// after 5. 5's title and 6's body both stay.
	version = 5
	eggs := update(map[string]any{"body": "eggs"})
	version = 4
	market := update(map[string]any{"title": "Market"})
	w.waitApplied(market, eggs)
	check("Market", 4, 6, 5)
	require.GreaterOrEqual(t, w.inboxDeliveries(eggs), 2, "version 6 was held back, applied on a redelivery")
	require.Equal(t, 1, w.inboxDeliveries(market))

	// The delete, version 7, makes it a tombstone; the guard's row says
	// so, for the cleanup.
	gone := w.publishNote(n, contract.EventNoteDeleted, now, map[string]any{"id": n.id, "deleted_at": ts, "version": 7})
	w.waitApplied(gone)
	got := w.projected(n)
	require.True(t, got.Deleted())
	require.Equal(t, int64(7), *got.Version)
	require.Equal(t, 1, w.count(`SELECT count(*) FROM quill_consumer_versions WHERE consumer = $1 AND note_id = $2 AND version = 7 AND deleted`,
		testDurable, n.id))
	w.waitDrained()
	assert.Zero(t, w.count(`SELECT count(*) FROM quill_consumer_dead_letters`), "dead letters")
}
