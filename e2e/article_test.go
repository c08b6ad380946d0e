package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
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

// sqlInjectFailure is the article's "Injected failure before operation
// record", in the article's own schema: while article_fail has a row, the
// operation record's insert raises once the write's note is there — after
// the effect, before the COMMIT, inside the one statement production runs.
const sqlInjectFailure = `
CREATE TABLE article_fail (on_ boolean PRIMARY KEY);
CREATE FUNCTION article_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM article_fail)
		AND EXISTS (SELECT 1 FROM notes WHERE tenant = NEW.tenant AND '/v1/notes/' || id = NEW.resource) THEN
		RAISE EXCEPTION 'injected failure before the operation record';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER article_fail AFTER INSERT ON operations FOR EACH ROW EXECUTE FUNCTION article_fail();`

// article is the world of the article's script: the real API over HTTP on
// a fresh schema, with its metrics, a trigger that fails a write after its
// note is inserted and before its record is committed (failWrites), and a
// relay publishing to JetStream.
type article struct {
	t      *testing.T
	url    string
	js     jetstream.JetStream
	stream string
	pool   *pgxpool.Pool
	reg    *prometheus.Registry
	tokens map[string]string
}

func newArticle(t *testing.T, tenants ...string) *article {
	t.Helper()
	pool, u := dbtest.Pool(t, 8)
	a := &article{t: t, pool: pool, reg: prometheus.NewRegistry(), tokens: map[string]string{}}
	m := metrics.NewAPI(a.reg, contract.ActionCreateNote, contract.ActionDeleteNote)
	_, err := pool.Exec(t.Context(), sqlInjectFailure)
	require.NoError(t, err)
	svc, err := notes.NewService(pool, notes.Config{Wait: time.Second}, zerolog.Nop(), notes.WithObserver(m))
	require.NoError(t, err)
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Deps{Pool: pool, Notes: svc, Log: zerolog.Nop(), Metrics: m}))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	for _, tenant := range tenants {
		a.tokens[tenant], err = auth.Create(t.Context(), pool, tenant, time.Now())
		require.NoError(t, err)
	}

	nats := natstest.Start(t)
	nc, _ := nats.Connect(t, relay.ConnOptions()...)
	_, a.js = nats.Connect(t)
	rpool, err := db.Open(t.Context(), u, 4)
	require.NoError(t, err)
	t.Cleanup(rpool.Close)
	suffix := strings.ToUpper(testkit.UniqueSuffix())
	a.stream = "ARTICLE_" + suffix
	r, err := relay.New(rpool, nc, relay.Config{Stream: stream.Config{Name: a.stream, SubjectPrefix: "a" + strings.ToLower(suffix)},
		PollInterval: 50 * time.Millisecond}, zerolog.Nop(), metrics.NewRelay(prometheus.NewRegistry()))
	require.NoError(t, err)
	require.NoError(t, r.Provision(t.Context()))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, r.Run(ctx)) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return a
}

// createNote is the article's create_note(tenant, op_key, title) over HTTP.
func (a *article) createNote(tenant, key, title string) (int, http.Header, []byte) {
	a.t.Helper()
	body, err := json.Marshal(map[string]string{"title": title})
	require.NoError(a.t, err)
	req, err := http.NewRequestWithContext(a.t.Context(), http.MethodPost, a.url+"/v1/notes", bytes.NewReader(body))
	require.NoError(a.t, err)
	req.Header.Set("Authorization", "Bearer "+a.tokens[tenant])
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(a.t, err)
	return resp.StatusCode, resp.Header, b
}

// failWrites turns the injected failure (sqlInjectFailure) on or off.
func (a *article) failWrites(on bool) {
	a.t.Helper()
	sql := `DELETE FROM article_fail`
	if on {
		sql = `INSERT INTO article_fail VALUES (true)`
	}
	_, err := a.pool.Exec(a.t.Context(), sql)
	require.NoError(a.t, err)
}

func (a *article) count(table string) int {
	a.t.Helper()
	var n int
	require.NoError(a.t, a.pool.QueryRow(a.t.Context(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}

// counter reads one counter of the API's registry.
func (a *article) counter(name string, labels map[string]string) float64 {
	a.t.Helper()
	families, err := a.reg.Gather()
	require.NoError(a.t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	a.t.Fatalf("no counter %s%v", name, labels)
	return 0
}

// The article's own script, step by step and in its order, against the real
// API, PostgreSQL and a relay publishing to JetStream: the first create and
// its replay, the changed title refused, the injected failure after the
// effect and before the record rolled back, a new key with the same title,
// the first key in another tenant — and its final counts, exactly.
func TestArticleScript(t *testing.T) {
	t.Parallel()
	suffix := strings.ToLower(uuid.NewString()[:8])
	demoA, demoB := "demo-a-"+suffix, "demo-b-"+suffix
	a := newArticle(t, demoA, demoB)
	notesOf := func() int { return a.count("notes") }

	// Local simulation: commit succeeded, but the caller lost the response.
	status, _, first := a.createNote(demoA, "operation-1", "Example note")
	require.Equal(t, http.StatusCreated, status, "%s", first)
	status, hdr, retry := a.createNote(demoA, "operation-1", "Example note")
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "true", hdr.Get("Idempotent-Replayed"))
	require.Equal(t, first, retry, "assert first == retry")
	require.Equal(t, 1, notesOf())

	status, _, conflict := a.createNote(demoA, "operation-1", "Changed title")
	require.Equal(t, http.StatusUnprocessableEntity, status, "Conflicting parameters accepted")
	var p struct {
		Code   string   `json:"code"`
		Fields []string `json:"fields"`
	}
	require.NoError(t, json.Unmarshal(conflict, &p))
	require.Equal(t, "idempotency_key_reused", p.Code)
	require.Equal(t, []string{"title"}, p.Fields)

	a.failWrites(true)
	status, _, body := a.createNote(demoA, "operation-fail", "Rollback")
	a.failWrites(false)
	require.Equal(t, http.StatusInternalServerError, status, "%s", body)
	require.Equal(t, 1, notesOf())
	require.Equal(t, 1, a.count("operations"))
	require.Equal(t, 1, a.count("outbox_events"), "the failed write's event rolled back with it")

	status, _, second := a.createNote(demoA, "operation-2", "Example note")
	require.Equal(t, http.StatusCreated, status)
	status, _, other := a.createNote(demoB, "operation-1", "Example note")
	require.Equal(t, http.StatusCreated, status)
	ids := map[string]bool{}
	for _, b := range [][]byte{first, second, other} {
		var n struct {
			ID    string `json:"id"`
			Title string `json:"title"`
		}
		require.NoError(t, json.Unmarshal(b, &n))
		require.Equal(t, "Example note", n.Title)
		ids[n.ID] = true
	}
	require.Len(t, ids, 3, "three notes with the same title")

	// "Replay kept one note; conflict rejected; rollback passed; total notes: 3"
	require.Equal(t, 3, notesOf())
	require.Equal(t, 3, a.count("operations"))
	require.Equal(t, 3, a.count("outbox_events"))
	require.Equal(t, 3.0, a.counter("quill_business_effects_total", map[string]string{"action": contract.ActionCreateNote}))
	require.Equal(t, 3.0, a.counter("quill_idempotency_requests_total", map[string]string{"action": contract.ActionCreateNote, "outcome": "executed"}))
	require.Equal(t, 1.0, a.counter("quill_idempotency_requests_total", map[string]string{"action": contract.ActionCreateNote, "outcome": "replayed"}))
	require.Equal(t, 1.0, a.counter("quill_idempotency_requests_total", map[string]string{"action": contract.ActionCreateNote, "outcome": "key_reused"}))
	require.Equal(t, 0.0, a.counter("quill_business_effects_total", map[string]string{"action": contract.ActionDeleteNote}))
	testkit.WaitFor(t, 30*time.Second, func() bool {
		var published int
		require.NoError(t, a.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_events WHERE stream_seq IS NOT NULL`).Scan(&published))
		return published == 3
	}, "the three note.created events in the stream")
	require.Len(t, natstest.StreamMessages(t, a.js, a.stream, ">"), 3)
}
