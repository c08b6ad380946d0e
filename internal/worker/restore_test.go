package worker_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
)

// The PostgreSQL 15 client programs, when they are not on PATH.
const pgBin = "/usr/lib/postgresql/15/bin"

// heldWindow is the stream's duplicate window when a test waits it out;
// openWindow is one that a test finishes well within.
const (
	heldWindow = 3 * time.Second
	openWindow = time.Minute
)

// restoreWorld is a restore test's world: the worker harness (schema, NATS,
// stream, worker), a relay with a short duplicate window, the API over
// HTTP that can lose its answers, and an agent's journalled client.
type restoreWorld struct {
	*harness
	window time.Duration
	api    *httptest.Server
	svc    atomic.Pointer[http.Handler]
	drop   atomic.Bool
	token  string
	client *client.Client
	jrnl   *client.FileJournal
	// stopWorker stops the worker.
	stopWorker func()
}

func newRestoreWorld(t *testing.T, window time.Duration) *restoreWorld {
	t.Helper()
	pool, u := dbtest.Pool(t, 8)
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	h := &harness{t: t, url: u, pool: pool, srv: srv, js: js, suffix: suffix,
		stream: "R_" + strings.ToUpper(suffix), prefix: "q" + suffix, tenant: "acme-" + suffix}
	h.validateEventsAtCleanup()
	w := &restoreWorld{harness: h, window: window}
	w.startAPI()
	w.api = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if !w.drop.Load() {
			(*w.svc.Load()).ServeHTTP(rw, r)
			return
		}
		// The request executes in full; its answer is lost on the way.
		(*w.svc.Load()).ServeHTTP(httptest.NewRecorder(), r)
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(w.api.Close)
	var err error
	w.token, err = auth.Create(t.Context(), pool, h.tenant, time.Now())
	require.NoError(t, err)
	w.jrnl, err = client.OpenFileJournal(t.TempDir())
	require.NoError(t, err)
	w.client, err = client.New(client.Config{BaseURL: w.api.URL, Token: w.token, Journal: w.jrnl,
		Attempts: 2, Deadline: 3 * time.Second, AttemptTimeout: time.Second, LookupTimeout: 500 * time.Millisecond,
		BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond})
	require.NoError(t, err)
	w.startRelay()
	_, w.stopWorker = h.startWorker(h.config(), "")
	return w
}

// startAPI serves the API from a new notes service: a restarted API, with
// nothing remembered in memory from before.
func (w *restoreWorld) startAPI() {
	svc, err := notes.NewService(w.pool, notes.Config{Wait: time.Second}, zerolog.Nop())
	require.NoError(w.t, err)
	h := httpapi.NewServer(httpapi.Deps{Pool: w.pool, Notes: svc, Log: zerolog.Nop()})
	w.svc.Store(&h)
}

func (w *restoreWorld) startRelay() {
	t := w.t
	pool, err := db.Open(context.Background(), w.url, 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	nc, _ := w.srv.Connect(t, relay.ConnOptions()...)
	cfg := relay.Config{Stream: stream.Config{Name: w.stream, SubjectPrefix: w.prefix, DuplicateWindow: w.window, MaxAge: time.Hour},
		Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxBackoff: 250 * time.Millisecond, AckTimeout: time.Second, Batch: 256}
	r, err := relay.New(pool, nc, cfg, testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()))
	require.NoError(t, err)
	require.NoError(t, r.Provision(t.Context()))
	w.stopRelay = runUntilCleanup(t, r.Run)
}

func (w *restoreWorld) create(title string, data []byte) (*client.Created, error) {
	n := client.NewNote{Title: title}
	if data != nil {
		n.Attachment = &client.NewAttachment{Filename: title + ".txt", ContentType: "text/plain", Data: data}
	}
	return w.client.CreateNote(w.t.Context(), n)
}

// settleAll waits until every event is published and no attachment is
// pending.
func (w *restoreWorld) settleAll() {
	w.t.Helper()
	testkit.WaitFor(w.t, waitLong, func() bool {
		return w.count(`SELECT count(*) FROM outbox_events WHERE published_at IS NULL`) == 0 &&
			w.count(`SELECT count(*) FROM attachments WHERE status = 'pending'`) == 0
	}, "every event published and every attachment processed")
}

// schema is the test's schema, from its URL's search_path.
func (w *restoreWorld) schema() string {
	u, err := url.Parse(w.url)
	require.NoError(w.t, err)
	s := u.Query().Get("search_path")
	require.NotEmpty(w.t, s)
	return s
}

// baseURL is the test database's URL as libpq takes it.
func baseURL(t testing.TB) string {
	u, err := url.Parse(dbtest.URL())
	require.NoError(t, err)
	return u.String()
}

// pgTool runs one of PostgreSQL's client programs.
func pgTool(t testing.TB, name string, args ...string) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		path = filepath.Join(pgBin, name)
	}
	out, err := exec.CommandContext(t.Context(), path, args...).CombinedOutput()
	require.NoError(t, err, "%s: %s", name, out)
}

// dump takes a backup of the schema's data with pg_dump.
func (w *restoreWorld) dump() string {
	file := filepath.Join(w.t.TempDir(), "backup.dump")
	pgTool(w.t, "pg_dump", "--format=custom", "--data-only", "--schema="+w.schema(), "--file="+file, "--dbname="+baseURL(w.t))
	return file
}

// restore empties every table of the schema and restores the backup into
// it with pg_restore: the database as it was when the backup was taken.
// The processes are stopped around it, as an operator does.
func (w *restoreWorld) restore(file string) {
	t := w.t
	w.stopRelay()
	w.stopWorker()
	rows, err := w.pool.Query(t.Context(), `SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = $1`, w.schema())
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	_, err = w.pool.Exec(t.Context(), `TRUNCATE `+strings.Join(tables, ", ")+` RESTART IDENTITY`)
	require.NoError(t, err)
	// The backup holds the relays' queue as it was: its triggers must not
	// add to it while the outbox is restored.
	pgTool(t, "pg_restore", "--data-only", "--disable-triggers", "--exit-on-error", "--dbname="+baseURL(t), file)
	w.startAPI()
}

// eventIDs returns the outbox's event ids by note and type.
func (w *restoreWorld) eventIDs() map[string]string {
	rows, err := w.pool.Query(w.t.Context(), `SELECT aggregate_id::text || ' ' || type, id::text FROM outbox_events`)
	require.NoError(w.t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		require.NoError(w.t, rows.Scan(&k, &v))
		require.NotContains(w.t, out, k, "one event of each type per note")
		out[k] = v
	}
	require.NoError(w.t, rows.Err())
	return out
}

// streamByID returns the stream's messages by Nats-Msg-Id.
func (w *restoreWorld) streamByID() map[string][]*natsMsg {
	out := map[string][]*natsMsg{}
	for _, m := range natstest.StreamMessages(w.t, w.js, w.stream, w.prefix+".>") {
		id := m.Header.Get(nats.MsgIdHdr)
		out[id] = append(out[id], &natsMsg{subject: m.Subject, data: m.Data})
	}
	return out
}

type natsMsg struct {
	subject string
	data    []byte
}

// lostWindow is what was done between the backup and the failure.
type lostWindow struct {
	backup string
	// settled was answered; lost are those whose answers were lost, so
	// their journal entries are unsettled.
	settled   *client.Created
	lostKeys  []string
	notes     map[string]string // key → note id, every create of the window
	events    map[string]string // eventIDs() before the failure
	stream    map[string][]*natsMsg
	deletedID string
}

// beforeTheFailure creates notes, takes the backup, then does more work —
// one create answered, two creates and a delete whose answers are lost —
// and lets the relay and the worker finish it all.
func (w *restoreWorld) beforeTheFailure() lostWindow {
	t := w.t
	_, err := w.create("before the backup", []byte("kept by the backup"))
	require.NoError(t, err)
	doomed, err := w.create("deleted after the backup", nil)
	require.NoError(t, err)
	w.settleAll()
	lw := lostWindow{backup: w.dump(), notes: map[string]string{}, deletedID: doomed.Note.ID}

	lw.settled, err = w.create("answered after the backup", []byte("one"))
	require.NoError(t, err)
	lw.notes[lw.settled.Key] = lw.settled.Note.ID
	w.drop.Store(true)
	for _, title := range []string{"lost answer with attachment", "lost answer"} {
		var data []byte
		if strings.Contains(title, "attachment") {
			data = []byte("two")
		}
		_, err := w.create(title, data)
		var unknown *client.UnknownOutcomeError
		require.ErrorAs(t, err, &unknown)
		lw.lostKeys = append(lw.lostKeys, unknown.Key)
	}
	_, err = w.client.DeleteNote(t.Context(), doomed.Note.ID)
	var unknown *client.UnknownOutcomeError
	require.ErrorAs(t, err, &unknown)
	lw.lostKeys = append(lw.lostKeys, unknown.Key)
	w.drop.Store(false)
	unsettled, err := w.jrnl.Unsettled(t.Context())
	require.NoError(t, err)
	require.Len(t, unsettled, 3, "the lost answers are unsettled in the journal")

	w.settleAll()
	for _, key := range lw.lostKeys[:2] {
		var resource string
		require.NoError(t, w.pool.QueryRow(t.Context(),
			`SELECT resource FROM operations WHERE tenant = $1 AND key = $2`, w.tenant, key).Scan(&resource))
		lw.notes[key] = strings.TrimPrefix(resource, "/v1/notes/")
	}
	require.Equal(t, 1, w.count(`SELECT count(*) FROM notes WHERE deleted_at IS NOT NULL`))
	lw.events = w.eventIDs()
	lw.stream = w.streamByID()
	require.Len(t, lw.events, 9, "5 note.created, 3 attachment.processed, 1 note.deleted")
	require.Len(t, lw.stream, 9, "one stream message per event")
	for id, msgs := range lw.stream {
		require.Len(t, msgs, 1, id)
	}
	return lw
}

// afterTheRestore resumes the journal and sends the answered operation
// again under its key, as docs/operations.md tells the operator, and
// checks that every intent has one note, with the id it had before.
func (w *restoreWorld) afterTheRestore(lw lostWindow) {
	t := w.t
	ctx := t.Context()
	require.Equal(t, 2, w.count(`SELECT count(*) FROM notes`), "the backup's notes")
	require.Equal(t, 0, w.count(`SELECT count(*) FROM notes WHERE deleted_at IS NOT NULL`), "the backup predates the delete")

	resumed, err := w.client.Resume(ctx)
	require.NoError(t, err)
	require.Len(t, resumed, 3)
	for _, r := range resumed {
		require.NoError(t, r.Err, r.Entry.Key)
		if r.Created != nil {
			require.Equal(t, lw.notes[r.Entry.Key], r.Created.Note.ID, "the resumed create has its note's id")
			require.False(t, r.Created.Replayed, "it executed again: the restore lost its record")
		}
	}
	// The answered create is settled in the journal: the operator sends
	// it again, from its journal record, under its key.
	e, err := w.jrnl.Get(ctx, lw.settled.Key)
	require.NoError(t, err)
	var n client.NewNote
	require.NoError(t, json.Unmarshal(e.Params, &n))
	again, err := w.client.CreateNote(ctx, n, client.WithKey(e.Key))
	require.NoError(t, err)
	require.Equal(t, lw.settled.Note.ID, again.Note.ID)
	require.Equal(t, lw.settled.Note.Attachment.ID, again.Note.Attachment.ID)

	require.Equal(t, 5, w.count(`SELECT count(*) FROM notes`), "one note per intent")
	require.Equal(t, 1, w.count(`SELECT count(*) FROM notes WHERE deleted_at IS NOT NULL`))
	require.Equal(t, 6, w.count(`SELECT count(*) FROM operations`), "2 kept by the backup, 4 executed again")
}

// Restored from an older backup and restarted at once: every operation
// resumed from the journal converges on the note it made before, and the
// relay's republished events carry their old ids, so JetStream's duplicate
// window drops every one of them — consumers see nothing new. The worker,
// whose inbox was restored too, therefore never sees the note.created
// again: the re-created attachments stay pending, which api audit reports
// as unprocessed (docs/operations.md: hold the relays for the duplicate
// window).
func TestRestoreWithinTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	w := newRestoreWorld(t, openWindow)
	lw := w.beforeTheFailure()
	w.restore(lw.backup)
	w.startRelay()
	_, w.stopWorker = w.startWorker(w.config(), "")
	w.afterTheRestore(lw)

	testkit.WaitFor(t, waitLong, func() bool {
		return w.count(`SELECT count(*) FROM outbox_events WHERE published_at IS NULL`) == 0
	}, "every event published again")
	require.Equal(t, 4, w.count(`SELECT count(*) FROM outbox_events WHERE ack_duplicate`),
		"3 note.created and 1 note.deleted republished inside the window, each acknowledged as a duplicate")
	events := w.eventIDs()
	for k, id := range events {
		if strings.HasSuffix(k, " attachment.processed") {
			continue // the backup's own, or none yet
		}
		require.Equal(t, lw.events[k], id, "%s has its old id", k)
	}
	require.Equal(t, lw.stream, w.streamByID(), "the stream holds exactly what it held before the restore")

	rep, err := audit.Run(t.Context(), w.pool, w.js, "", audit.Config{Stream: stream.Config{Name: w.stream, SubjectPrefix: w.prefix},
		Consumer: w.config().Consumer.Durable, ProcessThreshold: time.Nanosecond})
	require.NoError(t, err)
	var unprocessed []string
	for _, a := range rep.Anomalies {
		if a.Kind == audit.KindUnprocessed {
			unprocessed = append(unprocessed, a.AttachmentID)
		}
	}
	require.Len(t, unprocessed, 2, "the audit finds both re-created attachments: %+v", rep.Anomalies)
	require.Equal(t, 2, w.count(`SELECT count(*) FROM attachments WHERE status = 'pending'`))
}

// Restored from an older backup with the relays held for the duplicate
// window (docs/operations.md): the republished events are new stream
// messages under their old ids; the worker processes the re-created
// attachments again and writes attachment.processed events under the ids
// they had; a consumer that deduplicates by event id (as it must) sees each
// event once, and the second copies are the same note.
func TestRestoreWithRelaysHeldForTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	w := newRestoreWorld(t, heldWindow)
	lw := w.beforeTheFailure()
	failed := time.Now()
	w.restore(lw.backup)
	_, w.stopWorker = w.startWorker(w.config(), "")
	w.afterTheRestore(lw)
	time.Sleep(time.Until(failed.Add(w.window + 500*time.Millisecond))) // the procedure itself waits
	w.startRelay()
	w.settleAll()

	require.Equal(t, 0, w.count(`SELECT count(*) FROM outbox_events WHERE ack_duplicate`), "beyond the window nothing is dropped")
	require.Equal(t, lw.events, w.eventIDs(), "every event, attachment.processed included, has its old id")
	after := w.streamByID()
	require.Len(t, after, len(lw.stream), "no new event id reached the stream")
	for id, msgs := range after {
		require.NotEmpty(t, lw.stream[id], "event %s was in the stream before", id)
		for _, m := range msgs[1:] {
			require.Equal(t, msgs[0].subject, m.subject)
			require.Equal(t, sameEvent(t, msgs[0].data), sameEvent(t, m.data), "a second copy of %s is the same event", id)
		}
	}
	require.Equal(t, 0, w.count(`SELECT count(*) FROM attachments WHERE status <> 'processed'`))
}

// sameEvent is what two copies of one event must agree on: everything but
// the times, which an execution after the restore sets anew.
func sameEvent(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var ev map[string]any
	require.NoError(t, json.Unmarshal(data, &ev))
	delete(ev, "time")
	if d, ok := ev["data"].(map[string]any); ok {
		delete(d, "created_at")
		delete(d, "deleted_at")
		delete(d, "updated_at")
	}
	return ev
}
