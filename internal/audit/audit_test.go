package audit_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/webhooks"
	"github.com/quillhq/quill/internal/whsecret"
	"github.com/quillhq/quill/internal/worker"
)

// bundle is one test's world: a fresh schema, a stream and subject prefix of
// its own on a NATS server, a tenant, and the API's notes service.
type bundle struct {
	t      *testing.T
	pool   *pgxpool.Pool
	url    string
	srv    *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	svc    *notes.Service
	stream string
	prefix string
	tenant string
}

// setup creates the world; the stream (MaxAge 1h) is created here, as the
// relay would, unless the test starts a relay itself.
func setup(t *testing.T, srv *natstest.Server) *bundle {
	t.Helper()
	pool, u := dbtest.Pool(t, 8)
	if srv == nil {
		srv = natstest.Start(t)
	}
	nc, js := srv.Connect(t)
	suffix := testkit.UniqueSuffix()
	svc, err := notes.NewService(pool, notes.Config{}, zerolog.Nop())
	require.NoError(t, err)
	b := &bundle{t: t, pool: pool, url: u, srv: srv, nc: nc, js: js, svc: svc,
		stream: "A_" + strings.ToUpper(suffix), prefix: "q" + suffix, tenant: "acme-" + suffix}
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.prefix + ".>"},
		Storage: jetstream.FileStorage, Duplicates: 100 * time.Millisecond, MaxAge: time.Hour})
	require.NoError(t, err)
	return b
}

func (b *bundle) config() audit.Config {
	return audit.Config{Stream: stream.Config{Name: b.stream, SubjectPrefix: b.prefix}, Consumer: "attachment-worker-" + b.prefix}
}

func (b *bundle) audit(mod func(*audit.Config)) *audit.Report {
	b.t.Helper()
	cfg := b.config()
	if mod != nil {
		mod(&cfg)
	}
	rep, err := audit.Run(b.t.Context(), b.pool, b.js, "", cfg)
	require.NoError(b.t, err)
	return rep
}

var pngAttachment = func() *notes.NewAttachment {
	data := []byte("hello, world\nsecond line\n")
	sum := sha256.Sum256(data)
	return &notes.NewAttachment{Filename: "a.txt", ContentType: "text/plain", Data: data, SHA256: hex.EncodeToString(sum[:])}
}()

// create creates a note as operation key through the service and returns
// its id.
func (b *bundle) create(key string, withAttachment bool) uuid.UUID {
	b.t.Helper()
	p := notes.CreateParams{Title: "t " + key}
	if withAttachment {
		p.Attachment = pngAttachment
	}
	out, err := b.svc.Create(b.t.Context(), notes.Request{Tenant: b.tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite}, p)
	require.NoError(b.t, err)
	id, err := uuid.Parse(strings.TrimPrefix(out.Resource, "/v1/notes/"))
	require.NoError(b.t, err)
	return id
}

// update sets note id's title as operation key through the service, made
// against version ifMatch, and returns the recorded outcome.
func (b *bundle) update(key string, id uuid.UUID, ifMatch int, title string) notes.Answer {
	b.t.Helper()
	out, err := b.svc.Update(b.t.Context(), notes.Request{Tenant: b.tenant, Key: key, Wait: -1, IfMatch: ifMatch, Render: httpapi.RenderWrite},
		id, notes.UpdateParams{Title: &title})
	require.NoError(b.t, err)
	return out
}

// del deletes note id as operation key through the service, under If-Match
// ifMatch (0: none), and returns the recorded outcome.
func (b *bundle) del(key string, id uuid.UUID, ifMatch int) notes.Answer {
	b.t.Helper()
	out, err := b.svc.Delete(b.t.Context(), notes.Request{Tenant: b.tenant, Key: key, Wait: -1, IfMatch: ifMatch, Render: httpapi.RenderWrite}, id)
	require.NoError(b.t, err)
	return out
}

func (b *bundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.pool.Exec(b.t.Context(), sql, args...)
	require.NoError(b.t, err)
}

// publish does what the relay does for every unpublished event: publish it
// with its id as Nats-Msg-Id and mark it published with the stream sequence.
func (b *bundle) publish() {
	b.t.Helper()
	ctx := b.t.Context()
	rows, err := b.pool.Query(ctx, `SELECT seq, id, tenant, type, payload FROM outbox_events WHERE published_at IS NULL ORDER BY seq`)
	require.NoError(b.t, err)
	type ev struct {
		seq         int64
		id          uuid.UUID
		tenant, typ string
		payload     []byte
	}
	var evs []ev
	for rows.Next() {
		var e ev
		require.NoError(b.t, rows.Scan(&e.seq, &e.id, &e.tenant, &e.typ, &e.payload))
		evs = append(evs, e)
	}
	require.NoError(b.t, rows.Err())
	for _, e := range evs {
		ack := b.publishMsg(e.id.String(), contract.Subject(b.prefix, e.tenant, e.typ), e.payload)
		b.exec(`UPDATE outbox_events SET published_at = now(), stream_seq = $2 WHERE seq = $1`, e.seq, int64(ack.Sequence))
	}
}

func (b *bundle) publishMsg(id, subject string, payload []byte) *jetstream.PubAck {
	b.t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = payload
	msg.Header.Set(jetstream.MsgIDHeader, id)
	ack, err := b.js.PublishMsg(b.t.Context(), msg)
	require.NoError(b.t, err)
	return ack
}

// process does what the worker does for a note.created event with an
// attachment: inbox row, attachment processed, attachment.processed event
// under the create's key (each call a new event id).
func (b *bundle) process(noteID uuid.UUID) {
	b.t.Helper()
	ctx := b.t.Context()
	var eventID, attID uuid.UUID
	var key string
	require.NoError(b.t, b.pool.QueryRow(ctx, `SELECT e.id, a.id, a.operation_key FROM outbox_events e JOIN attachments a ON a.note_id = e.aggregate_id
		WHERE e.aggregate_id = $1 AND e.type = 'note.created'`, noteID).Scan(&eventID, &attID, &key))
	now := time.Now().UTC().Truncate(time.Microsecond)
	b.exec(`INSERT INTO quill_consumer_inbox (consumer, event_id, event_type, stream_seq, deliveries, processed_at) VALUES ($1, $2, 'quill.note.created.v1', 0, 1, $3) ON CONFLICT DO NOTHING`, b.config().Consumer, eventID, now)
	b.exec(`UPDATE attachments SET status = 'processed', processed_at = $2 WHERE id = $1`, attID, now)
	require.NoError(b.t, outbox.Insert(ctx, b.pool, outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: b.tenant, OperationKey: key, AggregateID: noteID,
		Type: contract.EventAttachmentProcessed, Time: now, Data: map[string]string{"state": "processed"}}))
}

func (b *bundle) eventOf(noteID uuid.UUID, typ string) uuid.UUID {
	b.t.Helper()
	var id uuid.UUID
	require.NoError(b.t, b.pool.QueryRow(b.t.Context(),
		`SELECT id FROM outbox_events WHERE aggregate_id = $1 AND type = $2 ORDER BY seq LIMIT 1`, noteID, typ).Scan(&id))
	return id
}

func kinds(rep *audit.Report) []string {
	var out []string
	for _, x := range rep.Anomalies {
		out = append(out, x.Kind)
	}
	return out
}

// requireAnomaly finds the anomaly of kind naming key (and event, when
// given) and returns it.
func requireAnomaly(t *testing.T, rep *audit.Report, kind, key string, event uuid.UUID) audit.Anomaly {
	t.Helper()
	for _, x := range rep.Anomalies {
		if x.Kind == kind && x.Key == key && (event == uuid.Nil || x.EventID == event.String()) {
			return x
		}
	}
	require.Failf(t, "anomaly not found", "no %s for key %q event %s in %+v", kind, key, event, rep.Anomalies)
	return audit.Anomaly{}
}

func text(t *testing.T, rep *audit.Report) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, rep.WriteText(&buf))
	return buf.String()
}

// The real pipeline — notes service, relay, attachment worker — leaves
// nothing to report, and the counts keep requests, effects and replays apart.
func TestCleanPipeline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, nil)
	logger := zerolog.Nop()

	rnc, _ := b.srv.Connect(t, relay.ConnOptions()...)
	r, err := relay.New(b.pool, rnc, relay.Config{Stream: stream.Config{Name: b.stream, SubjectPrefix: b.prefix, DuplicateWindow: time.Minute,
		MaxAge: time.Hour}, Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxBackoff: 250 * time.Millisecond,
		AckTimeout: time.Second}, logger, metrics.NewRelay(prometheus.NewRegistry()))
	require.NoError(t, err)
	require.NoError(t, r.Provision(ctx))
	wnc, _ := b.srv.Connect(t)
	w, err := worker.New(b.pool, wnc, worker.Config{Stream: b.config().Stream, Consumer: consumer.Config{Durable: b.config().Consumer,
		AckWait: 5 * time.Second, Concurrency: 2}}, logger, metrics.NewWorker(prometheus.NewRegistry()))
	require.NoError(t, err)
	require.NoError(t, w.Provision(ctx))
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- r.Run(runCtx) }()
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done; <-done })

	n1 := b.create("k1", true)
	n2 := b.create("k2", true)
	n3 := b.create("k3", false)
	b.create("k1", true) // a retry: replayed
	b.del("d1", n1, 0)
	// Updates of every outcome: one that changes the note (and its
	// retry), one that changes nothing, one against a stale version, one
	// of a note that does not exist; and a delete against a stale version.
	require.Equal(t, notes.OutcomeUpdated, b.update("u1", n2, 1, "edited").Outcome)
	require.True(t, b.update("u1", n2, 1, "edited").Replayed)
	require.Equal(t, notes.OutcomeUnchanged, b.update("u2", n2, 2, "edited").Outcome)
	require.Equal(t, notes.OutcomeVersionMismatch, b.update("u3", n2, 1, "stale").Outcome)
	require.Equal(t, notes.OutcomeNothingToUpdate, b.update("u4", uuid.New(), 1, "nobody").Outcome)
	require.Equal(t, notes.OutcomeVersionMismatch, b.del("d2", n3, 7).Outcome)
	_, err = b.svc.FlushReplays(ctx)
	require.NoError(t, err)

	testkit.WaitFor(t, 30*time.Second, func() bool {
		var pending, unprocessed int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_events WHERE published_at IS NULL),
			(SELECT count(*) FROM attachments WHERE status = 'pending' AND reason IS NULL)`).Scan(&pending, &unprocessed))
		return pending == 0 && unprocessed == 0
	}, "events published and attachments processed")
	// The deleted note's attachment may have been skipped (deleted first)
	// or processed; either way its events must all be out.
	testkit.WaitFor(t, 30*time.Second, func() bool {
		var pending int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events WHERE published_at IS NULL`).Scan(&pending))
		return pending == 0
	}, "attachment.processed events published")

	rep := b.audit(nil)
	require.Empty(t, rep.Anomalies, text(t, rep))
	require.True(t, rep.Complete())
	c := rep.Counts
	require.EqualValues(t, 9, c.Operations)
	require.EqualValues(t, map[string]int64{"create-note": 3, "delete-note": 2, "update-note": 4}, c.ByAction)
	require.EqualValues(t, 2, c.Replays)
	require.EqualValues(t, 11, c.Requests)
	require.EqualValues(t, 2, c.DuplicatesSuppressed.APIReplays)
	require.EqualValues(t, 3, c.BusinessEffects.NotesCreated)
	require.EqualValues(t, 1, c.BusinessEffects.NotesUpdated)
	require.EqualValues(t, 1, c.BusinessEffects.NotesDeleted)
	require.NotNil(t, c.DuplicatesSuppressed.RelayDuplicateAcks)
	require.EqualValues(t, 0, *c.DuplicatesSuppressed.RelayDuplicateAcks)
	require.NotNil(t, c.DuplicatesSuppressed.InboxDuplicates)
	require.EqualValues(t, 0, *c.DuplicatesSuppressed.InboxDuplicates)
	require.EqualValues(t, 0, c.DuplicatesFound)
	require.EqualValues(t, c.Events.Total, c.Events.Published)
	require.EqualValues(t, c.Events.Published, rep.Stream.Verified)
	require.EqualValues(t, c.Events.Published, rep.Stream.Scanned)
	require.Empty(t, rep.Chains, "only anomalous chains by default")

	// The key's chain: record, note, attachment, both events, inbox row.
	rep = b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, "k1" })
	require.Empty(t, rep.Anomalies)
	require.Len(t, rep.Chains, 1)
	ch := rep.Chains[0]
	require.Equal(t, "create-note", ch.Action)
	require.EqualValues(t, 1, ch.Replays)
	require.Len(t, ch.Notes, 1)
	require.Equal(t, n1.String(), ch.Notes[0].ID)
	require.NotNil(t, ch.Attachment)
	require.Equal(t, "note.created", ch.Events[0].Type)
	require.Equal(t, "ok", ch.Events[0].Stream)
	require.NotNil(t, ch.Events[0].Inbox, "the worker's inbox row")
	out := text(t, rep)
	if testing.Verbose() {
		t.Log("\n" + out)
	}
	require.Contains(t, out, b.tenant+"/k1  create-note completed 201")
	require.Contains(t, out, "RESULT: consistent")

	// The worker's attachment.processed is written under the create's key
	// (migration 00016): it belongs to the create's chain, and is not a
	// second event of the create.
	rep = b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, "k2" })
	require.Empty(t, rep.Anomalies, text(t, rep))
	var types []string
	for _, e := range rep.Chains[0].Events {
		types = append(types, e.Type)
	}
	require.Equal(t, []string{"note.created", "attachment.processed"}, types)
	var processedKey string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT operation_key FROM outbox_events WHERE type = 'attachment.processed' AND aggregate_id = $1`, n2).Scan(&processedKey))
	require.Equal(t, "k2", processedKey)

	// An update's chain: the key, the note, the version it made, its
	// note.updated event and its state; and the note's version history.
	rep = b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, "u1" })
	require.Empty(t, rep.Anomalies, text(t, rep))
	require.Len(t, rep.Chains, 1)
	ch = rep.Chains[0]
	require.Equal(t, "update-note", ch.Action)
	require.Equal(t, "updated", ch.Outcome)
	require.Equal(t, 200, ch.Status)
	require.Equal(t, 2, ch.Version)
	require.EqualValues(t, 1, ch.Replays)
	require.Len(t, ch.Events, 1)
	require.Equal(t, "note.updated", ch.Events[0].Type)
	require.Equal(t, 2, ch.Events[0].Version)
	require.Equal(t, "published", ch.Events[0].State)
	require.Equal(t, "ok", ch.Events[0].Stream)
	require.Nil(t, ch.Attachment)
	require.Len(t, ch.Notes, 1)
	require.Equal(t, n2.String(), ch.Notes[0].ID)
	require.Equal(t, 2, ch.Notes[0].Version)
	var hist []string
	for _, v := range ch.Notes[0].Versions {
		hist = append(hist, fmt.Sprintf("%d %s %s %s", v.Version, v.Type, v.Key, v.State))
	}
	require.Equal(t, []string{"1 note.created k2 published", "2 note.updated u1 published"}, hist)
	out = text(t, rep)
	if testing.Verbose() {
		t.Log("\n" + out)
	}
	require.Contains(t, out, b.tenant+"/u1  update-note completed 200")
	require.Contains(t, out, "outcome     updated: made version 2")
	require.Regexp(t, `note\.updated\s+v2\s+published`, out)
	require.Regexp(t, `v2\s+note\.updated\s+\S+\s+published\s+key u1`, out)

	// The outcomes that change nothing have no event.
	for key, want := range map[string]string{
		"u2": "unchanged: the note stays at version 2",
		"u3": "version_mismatch: If-Match named another version; the note was at version 2 (current_version)",
		"u4": "nothing_to_update: no live note",
		"d2": "version_mismatch: If-Match named another version; the note was at version 1 (current_version)",
	} {
		rep = b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, key })
		require.Empty(t, rep.Anomalies, key)
		require.Len(t, rep.Chains, 1, key)
		require.Empty(t, rep.Chains[0].Events, key)
		require.Contains(t, text(t, rep), "outcome     "+want, key)
	}
	rep = b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, "u3" })
	require.Equal(t, 412, rep.Chains[0].Status)
	require.Equal(t, 2, rep.Chains[0].CurrentVersion)
	require.Zero(t, rep.Chains[0].Version, "a 412 left no version")
}

// A note's whole life through the notes service — create, updates, an
// update that changes nothing, a stale one, the delete — has 0 anomalies,
// published or not, and its history has each version once, in order.
func TestVersionHistory(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := b.create("c1", false)
	require.Equal(t, 2, b.update("u1", id, 1, "two").ResourceVersion)
	require.Equal(t, 3, b.update("u2", id, 2, "three").ResourceVersion)
	require.Equal(t, notes.OutcomeUnchanged, b.update("u3", id, 3, "three").Outcome)
	require.Equal(t, notes.OutcomeVersionMismatch, b.update("u4", id, 2, "stale").Outcome)
	require.Equal(t, notes.OutcomeVersionMismatch, b.del("d0", id, 1).Outcome)
	require.Equal(t, 4, b.del("d1", id, 3).ResourceVersion)
	require.Equal(t, notes.OutcomeNothingToUpdate, b.update("u5", id, 4, "gone").Outcome)
	other := b.create("c2", false) // another note, its own history
	b.update("v1", other, 1, "x")

	check := func(state string) {
		t.Helper()
		rep := b.audit(nil)
		require.Empty(t, rep.Anomalies, text(t, rep))
		require.EqualValues(t, 3, rep.Counts.BusinessEffects.NotesUpdated)
		rep = b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, "c1" })
		require.Empty(t, rep.Anomalies, text(t, rep))
		n := rep.Chains[0].Notes[0]
		require.Equal(t, 4, n.Version)
		require.NotNil(t, n.DeletedAt)
		var hist []string
		for _, v := range n.Versions {
			hist = append(hist, fmt.Sprintf("%d %s %s %s", v.Version, v.Type, v.Key, v.State))
		}
		require.Equal(t, []string{"1 note.created c1 " + state, "2 note.updated u1 " + state, "3 note.updated u2 " + state,
			"4 note.deleted d1 " + state}, hist)
	}
	check("pending")
	b.publish()
	check("published")
}

// Faults in a note's version history, each planted in rows the notes
// service wrote, are each found.
func TestVersionFaults(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	for _, tc := range []struct {
		name string
		// build breaks a world and returns the anomalies expected, each
		// as kind and key.
		build func(b *bundle, id uuid.UUID) [][2]string
	}{
		{"an update's event deleted within the outbox retention", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.update("u2", id, 2, "three")
			b.exec(`DELETE FROM outbox_events WHERE operation_key = 'u1'`) // unpublished: no record keeps it
			return [][2]string{{audit.KindMissingEffect, "u1"}, {audit.KindVersionGap, "u1"}}
		}},
		{"the last update's event deleted", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.exec(`DELETE FROM outbox_events WHERE operation_key = 'u1'`)
			return [][2]string{{audit.KindMissingEffect, "u1"}, {audit.KindVersionGap, "u1"}}
		}},
		{"two updates accepted against one version", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.update("u2", id, 2, "three")
			// As a lost update would leave it: u2 made version 2 as well.
			b.exec(`UPDATE outbox_events SET payload = convert_to(jsonb_set(convert_from(payload, 'UTF8')::jsonb, '{data,version}', '2')::text, 'UTF8')
				WHERE operation_key = 'u2'`)
			b.exec(`UPDATE operations SET resource_version = 2 WHERE key = 'u2'`)
			b.exec(`UPDATE notes SET version = 2`)
			return [][2]string{{audit.KindDuplicateVersion, "u2"}}
		}},
		{"the note's version ahead of its events", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.exec(`UPDATE notes SET version = version + 1`)
			return [][2]string{{audit.KindVersionGap, "c1"}}
		}},
		{"an event with a version the note never reached", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.exec(`UPDATE notes SET version = 1`)
			return [][2]string{{audit.KindVersionGap, "u1"}}
		}},
		{"a note.updated without its operation record", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.exec(`DELETE FROM operations WHERE key = 'u1'`)
			return [][2]string{{audit.KindOrphanEffect, "u1"}}
		}},
		{"a note.updated under a create's key", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.exec(`UPDATE outbox_events SET operation_key = 'c1' WHERE operation_key = 'u1'`)
			return [][2]string{{audit.KindOrphanEffect, "c1"}, {audit.KindMissingEffect, "u1"}}
		}},
		{"an update's event with another version than its record", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.exec(`UPDATE operations SET resource_version = 5 WHERE key = 'u1'`)
			return [][2]string{{audit.KindChainMismatch, "u1"}}
		}},
		{"an event under an update that changed nothing", func(b *bundle, id uuid.UUID) [][2]string {
			b.update("u1", id, 1, "two")
			b.update("u2", id, 2, "two")
			b.exec(`INSERT INTO outbox_events (id, tenant, operation_key, aggregate_id, type, payload, created_at)
				SELECT gen_random_uuid(), tenant, 'u2', aggregate_id, type, payload, now() FROM outbox_events WHERE operation_key = 'u1'`)
			return [][2]string{{audit.KindUnexpectedEvent, "u2"}, {audit.KindDuplicateVersion, "u2"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, srv)
			id := b.create("c1", false)
			want := tc.build(b, id)
			rep := b.audit(nil)
			var got [][2]string
			for _, x := range rep.Anomalies {
				require.Equal(t, b.tenant, x.Tenant)
				require.Equal(t, id.String(), x.NoteID, "%+v", x)
				require.NotEmpty(t, x.Detail)
				got = append(got, [2]string{x.Kind, x.Key})
			}
			require.ElementsMatch(t, want, got, text(t, rep))
			out := text(t, rep)
			if testing.Verbose() {
				t.Log("\n" + out)
			}
			for _, w := range want {
				require.Contains(t, out, w[0])
				require.Contains(t, out, b.tenant+"/"+w[1])
			}
			if slices.ContainsFunc(want, func(w [2]string) bool { return w[0] == audit.KindVersionGap || w[0] == audit.KindDuplicateVersion }) {
				// The note's chain shows its history, the fault in it.
				rep := b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, "c1" })
				require.NotEmpty(t, rep.Chains[0].Notes[0].Versions)
			}
		})
	}
}

// Each anomaly, constructed in the database or the stream, is reported with
// the key and event it concerns.
func TestAnomalies(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	for _, tc := range []struct {
		name string
		// build breaks a world and returns the anomaly expected: kind, key
		// and event (uuid.Nil: any).
		build func(b *bundle) (string, string, uuid.UUID)
	}{
		{"note without operation record", func(b *bundle) (string, string, uuid.UUID) {
			b.create("k1", true)
			b.exec(`DELETE FROM operations WHERE key = 'k1'`)
			return audit.KindOrphanEffect, "k1", uuid.Nil
		}},
		{"event without operation record", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			ev := b.eventOf(id, "note.created")
			b.exec(`UPDATE outbox_events SET operation_key = 'ghost' WHERE id = $1`, ev)
			return audit.KindOrphanEffect, "ghost", ev
		}},
		{"deletion without operation record", func(b *bundle) (string, string, uuid.UUID) {
			b.create("k1", false)
			b.exec(`UPDATE notes SET deleted_at = now()`)
			return audit.KindOrphanEffect, "k1", uuid.Nil
		}},
		{"operation without its event", func(b *bundle) (string, string, uuid.UUID) {
			b.create("k1", false)
			b.exec(`DELETE FROM outbox_events`)
			return audit.KindMissingEffect, "k1", uuid.Nil
		}},
		{"pending too long", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			b.exec(`UPDATE outbox_events SET created_at = now() - interval '2 minutes'`)
			b.exec(`UPDATE operations SET created_at = now() - interval '2 minutes'`)
			return audit.KindPending, "k1", b.eventOf(id, "note.created")
		}},
		{"parked", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			b.exec(`UPDATE outbox_events SET parked_at = now(), parked_reason = 'payload too large'`)
			return audit.KindParked, "k1", b.eventOf(id, "note.created")
		}},
		{"unpublished and not queued", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			b.exec(`DELETE FROM outbox_pending`) // as a write with the triggers off would leave it
			return audit.KindUnqueued, "k1", b.eventOf(id, "note.created")
		}},
		{"published but never processed", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", true)
			b.publish()
			b.exec(`UPDATE outbox_events SET published_at = now() - interval '10 minutes'`)
			return audit.KindUnprocessed, "k1", b.eventOf(id, "note.created")
		}},
		{"dead letter", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", true)
			b.publish()
			ev := b.eventOf(id, "note.created")
			b.exec(`INSERT INTO quill_consumer_dead_letters (consumer, event_id, event_type, stream_seq, subject, payload, headers, reason, deliveries, created_at)
				VALUES ($1, $2, 'quill.note.created.v1', 1, $3, '', '{}', 'boom', 10, now())`, b.config().Consumer, ev.String(), b.prefix+"."+b.tenant+".note.created")
			b.exec(`UPDATE outbox_events SET published_at = now() - interval '10 minutes'`)
			return audit.KindDeadLetter, "k1", ev
		}},
		{"two notes for one operation", func(b *bundle) (string, string, uuid.UUID) {
			b.create("k1", false)
			other := b.create("k2", false)
			ev := b.eventOf(other, "note.created")
			b.exec(`UPDATE outbox_events SET operation_key = 'k1', created_at = created_at + interval '1 hour' WHERE id = $1`, ev)
			return audit.KindDuplicateNote, "k1", ev
		}},
		{"two created events for one operation", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			dup := uuid.Must(uuid.NewV7())
			b.exec(`INSERT INTO outbox_events (id, tenant, operation_key, aggregate_id, type, payload, created_at)
				SELECT $1, tenant, operation_key, aggregate_id, type, payload, created_at FROM outbox_events WHERE aggregate_id = $2`, dup, id)
			return audit.KindDuplicateEvent, "k1", dup
		}},
		{"two processed events for one attachment", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", true)
			b.process(id)
			b.process(id)
			return audit.KindDuplicateProcessed, "k1", uuid.Nil
		}},
		{"stream holds two messages for one event", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			b.publish()
			ev := b.eventOf(id, "note.created")
			// Republished after the duplicate window (100ms here).
			testkit.WaitFor(b.t, 10*time.Second, func() bool {
				msg := nats.NewMsg(b.prefix + "." + b.tenant + ".note.created")
				msg.Header.Set(jetstream.MsgIDHeader, ev.String())
				ack, err := b.js.PublishMsg(b.t.Context(), msg)
				require.NoError(b.t, err)
				return !ack.Duplicate
			}, "a republish beyond the duplicate window")
			return audit.KindDuplicateStreamMessage, "k1", ev
		}},
		{"published sequence holds another event", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			b.create("k2", false)
			b.publish()
			ev := b.eventOf(id, "note.created")
			b.exec(`UPDATE outbox_events SET stream_seq = CASE WHEN id = $1 THEN 2 ELSE 1 END`, ev)
			return audit.KindStreamMismatch, "k1", ev
		}},
		{"published sequence holds nothing", func(b *bundle) (string, string, uuid.UUID) {
			id := b.create("k1", false)
			b.publish()
			ev := b.eventOf(id, "note.created")
			b.exec(`UPDATE outbox_events SET stream_seq = 999`)
			return audit.KindStreamMissing, "k1", ev
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, srv)
			kind, key, ev := tc.build(b)
			rep := b.audit(nil)
			x := requireAnomaly(t, rep, kind, key, ev)
			require.Equal(t, b.tenant, x.Tenant)
			require.NotEmpty(t, x.Detail)
			out := text(t, rep)
			if testing.Verbose() {
				t.Log("\n" + out)
			}
			require.Contains(t, out, kind)
			require.Contains(t, out, b.tenant+"/"+key)
			if ev != uuid.Nil {
				require.Contains(t, out, ev.String())
			}
			require.Contains(t, out, fmt.Sprintf("RESULT: %d anomalies", len(rep.Anomalies)))
			// The chain of the key is printed with it.
			found := false
			for _, c := range rep.Chains {
				found = found || (c.Tenant == b.tenant && c.Key == key && len(c.Anomalies) > 0)
			}
			require.True(t, found, "chain of %s in %+v", key, rep.Chains)
		})
	}
}

// Thresholds: an event a moment old is not pending, a published event a
// moment old is not unprocessed.
func TestThresholdsAvoidFalseAlarms(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.create("k1", true) // unpublished, just now
	b.create("k2", true)
	b.exec(`UPDATE outbox_events SET published_at = now() - interval '1 minute', stream_seq = NULL WHERE operation_key = 'k2'`)
	rep := b.audit(nil)
	require.Empty(t, rep.Anomalies, text(t, rep))
	rep = b.audit(func(c *audit.Config) { c.PendingThreshold = time.Nanosecond; c.ProcessThreshold = time.Nanosecond })
	require.ElementsMatch(t, []string{audit.KindPending, audit.KindUnprocessed}, kinds(rep))
}

// Records removed by their retention are not anomalies: an operation
// compacted to a tombstone, one forgotten after the key retention, an event
// cleaned up after the outbox retention, an inbox row after the inbox
// retention, a stream message aged out after MaxAge.
func TestRetentionHorizonsAreNotAnomalies(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	cfg := func(c *audit.Config) {
		c.ResponseRetention, c.KeyRetention, c.OutboxRetention, c.InboxRetention = time.Hour, 2*time.Hour, time.Hour, time.Hour
	}
	// Tombstone: the record's response compacted, the chain still links.
	tomb := b.create("tomb", true)
	b.publish()
	b.process(tomb)
	b.publish()
	b.exec(`UPDATE operations SET response_body = NULL, compacted_at = now() WHERE key = 'tomb'`)

	// Forgotten: a note 3h old (key retention 2h) whose record, events and
	// inbox row are gone; its attachment processed 3h ago.
	old := b.create("old", true)
	b.publish()
	b.process(old)
	b.publish()
	b.exec(`UPDATE notes SET created_at = now() - interval '3 hours' WHERE id = $1`, old)
	b.exec(`UPDATE attachments SET processed_at = now() - interval '3 hours' WHERE note_id = $1`, old)
	b.exec(`DELETE FROM operations WHERE key = 'old'`)
	b.exec(`DELETE FROM quill_consumer_inbox WHERE event_id IN (SELECT id FROM outbox_events WHERE aggregate_id = $1)`, old)
	b.exec(`DELETE FROM outbox_events WHERE aggregate_id = $1`, old)

	// Cleaned up from the outbox only: the record remains, the events are
	// older than the outbox retention and gone.
	cleaned := b.create("cleaned", true)
	b.publish()
	b.process(cleaned)
	b.publish()
	b.exec(`UPDATE operations SET created_at = now() - interval '90 minutes', completed_at = now() - interval '90 minutes' WHERE key = 'cleaned'`)
	b.exec(`UPDATE attachments SET processed_at = now() - interval '90 minutes' WHERE note_id = $1`, cleaned)
	b.exec(`DELETE FROM outbox_events WHERE aggregate_id = $1`, cleaned)

	// Aged out of the stream: the message is gone and was published longer
	// ago than the stream's MaxAge (1h).
	aged := b.create("aged", false)
	b.publish()
	var seq int64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT stream_seq FROM outbox_events WHERE aggregate_id = $1`, aged).Scan(&seq))
	st, err := b.js.Stream(t.Context(), b.stream)
	require.NoError(t, err)
	require.NoError(t, st.DeleteMsg(t.Context(), uint64(seq)))
	b.exec(`UPDATE outbox_events SET published_at = now() - interval '61 minutes' WHERE aggregate_id = $1`, aged)

	// An edited note whose first versions' events the cleanup deleted
	// (their records keep them), updated again since.
	edited := b.create("ed", false)
	b.update("ed-u1", edited, 1, "two")
	b.publish()
	b.exec(`UPDATE operations SET created_at = created_at - interval '90 minutes', completed_at = completed_at - interval '90 minutes' WHERE key IN ('ed', 'ed-u1')`)
	b.exec(`UPDATE notes SET created_at = created_at - interval '90 minutes' WHERE id = $1`, edited)
	b.exec(`UPDATE outbox_events SET created_at = created_at - interval '90 minutes', published_at = published_at - interval '90 minutes' WHERE aggregate_id = $1`, edited)
	b.exec(`DELETE FROM outbox_events WHERE aggregate_id = $1`, edited)
	b.update("ed-u2", edited, 2, "three")

	// A note edited long ago, whose records were forgotten and events
	// cleaned, updated again now: its first versions are gone.
	forgotten := b.create("fe", false)
	b.update("fe-u1", forgotten, 1, "two")
	b.exec(`UPDATE notes SET created_at = now() - interval '3 hours' WHERE id = $1`, forgotten)
	b.exec(`DELETE FROM operations WHERE key IN ('fe', 'fe-u1')`)
	b.exec(`DELETE FROM outbox_events WHERE aggregate_id = $1`, forgotten)
	b.update("fe-u2", forgotten, 2, "three")

	rep := b.audit(cfg)
	require.Empty(t, rep.Anomalies, text(t, rep))
	require.EqualValues(t, 1, rep.Stream.AgedOut)
	require.EqualValues(t, 1, rep.Counts.Tombstones)
	require.True(t, rep.Complete())
	require.Contains(t, strings.Join(rep.Notes, "\n"), "MaxAge")

	// The cleaned operation's chain still shows its events, as its record
	// kept them (cleaned_events): published, with their stream sequence.
	rep = b.audit(func(c *audit.Config) { cfg(c); c.Tenant, c.Key = b.tenant, "cleaned" })
	require.Len(t, rep.Chains, 1)
	var kept []string
	for _, e := range rep.Chains[0].Events {
		require.True(t, e.Cleaned, "%+v", e)
		require.Equal(t, "published", e.State)
		require.NotNil(t, e.StreamSeq)
		require.NotNil(t, e.PublishedAt)
		require.Equal(t, cleaned.String(), e.NoteID)
		kept = append(kept, e.Type)
	}
	// The worker's attachment.processed is written under the create's key
	// (migration 00016): the record keeps it with the note.created.
	require.Equal(t, []string{"note.created", "attachment.processed"}, kept)

	history := func(key string) []string {
		t.Helper()
		rep := b.audit(func(c *audit.Config) { cfg(c); c.Tenant, c.Key = b.tenant, key })
		require.Empty(t, rep.Anomalies, text(t, rep))
		var out []string
		for _, v := range rep.Chains[0].Notes[0].Versions {
			out = append(out, fmt.Sprintf("%d %s %s", v.Version, v.Key, v.State))
		}
		return out
	}
	require.Equal(t, []string{"1 ed cleaned", "2 ed-u1 cleaned", "3 ed-u2 pending"}, history("ed-u2"))
	require.Equal(t, []string{"1  gone", "2  gone", "3 fe-u2 pending"}, history("fe-u2"))

	// The same absences inside their horizons are anomalies.
	b.exec(`UPDATE notes SET created_at = now() - interval '1 hour' WHERE id = $1`, old)
	b.exec(`UPDATE outbox_events SET published_at = now() - interval '50 minutes' WHERE aggregate_id = $1`, aged)
	rep = b.audit(cfg)
	requireAnomaly(t, rep, audit.KindOrphanEffect, "", uuid.Nil)
	requireAnomaly(t, rep, audit.KindStreamMissing, "aged", uuid.Nil)
	rep = b.audit(func(c *audit.Config) { cfg(c); c.OutboxRetention = 3 * time.Hour })
	requireAnomaly(t, rep, audit.KindMissingEffect, "cleaned", uuid.Nil)
}

// The layers' duplicate counters, when their columns exist, are summed.
func TestDuplicateCounters(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := b.create("k1", true)
	b.create("k1", true)
	_, err := b.svc.FlushReplays(t.Context())
	require.NoError(t, err)
	b.publish()
	b.process(id)
	b.publish()
	b.exec(`UPDATE outbox_events SET ack_duplicate = true WHERE type = 'note.created'`)
	b.exec(`UPDATE quill_consumer_inbox SET duplicates = 2, deliveries = 3`)
	rep := b.audit(nil)
	require.Empty(t, rep.Anomalies, text(t, rep))
	s := rep.Counts.DuplicatesSuppressed
	require.EqualValues(t, 1, s.APIReplays)
	require.EqualValues(t, 1, *s.RelayDuplicateAcks)
	require.EqualValues(t, 2, *s.InboxDuplicates)
	require.EqualValues(t, 4, s.Total)
	require.EqualValues(t, 3, *rep.Counts.Inbox.Deliveries)

	// Tenant scope counts the same.
	rep = b.audit(func(c *audit.Config) { c.Tenant = b.tenant })
	require.EqualValues(t, 4, rep.Counts.DuplicatesSuppressed.Total)
}

// Without NATS the database checks still run and the report says the
// stream was not checked: the audit is incomplete, not clean.
func TestStreamNotChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.create("k1", false)
	b.publish()
	rep, err := audit.Run(t.Context(), b.pool, nil, "NATS is not reachable at nats://127.0.0.1:1", b.config())
	require.NoError(t, err)
	require.Empty(t, rep.Anomalies)
	require.False(t, rep.Complete())
	require.Contains(t, rep.Stream.Reason, "not reachable")
	require.Contains(t, text(t, rep), "INCOMPLETE")

	// A stream that does not exist: same.
	rep = b.audit(func(c *audit.Config) { c.Stream.Name = "NO_SUCH_STREAM" })
	require.False(t, rep.Complete())
	require.Contains(t, rep.Stream.Reason, "NO_SUCH_STREAM")
}

// A key with nothing recorded is reported as such, without anomaly.
func TestUnknownKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	rep := b.audit(func(c *audit.Config) { c.Tenant, c.Key = b.tenant, "nope" })
	require.Empty(t, rep.Anomalies)
	require.False(t, rep.Scope.Found)
	require.Empty(t, rep.Chains)
}

// The audit reads the schema the migrations define: a database behind the
// latest migration, or never migrated, is refused with both versions named
// rather than audited in part.
func TestRefusesASchemaNotMigrated(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var latest int64
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT max(version_id) FROM goose_db_version`).Scan(&latest))
	_, err := b.pool.Exec(t.Context(), `DELETE FROM goose_db_version WHERE version_id = $1`, latest)
	require.NoError(t, err)
	var previous int64 // the numbers may have gaps
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT max(version_id) FROM goose_db_version`).Scan(&previous))
	_, err = audit.Run(t.Context(), b.pool, b.js, "", b.config())
	require.ErrorIs(t, err, audit.ErrSchemaVersion)
	require.ErrorContains(t, err, fmt.Sprintf("at version %d, the audit needs version %d", previous, latest))

	pool, err := db.Open(t.Context(), dbtest.EmptySchema(t), 2)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = audit.Run(t.Context(), pool, nil, "skipped", b.config())
	require.ErrorIs(t, err, audit.ErrSchemaVersion)
	require.ErrorContains(t, err, "no migrations applied")
}

// The webhook endpoints' writes are checked against the endpoints they
// name: a real create, rotation and delete leave nothing to report; a
// delete whose endpoint is not marked deleted, and an event under a
// webhook write's key, are anomalies.
func TestWebhookOperations(t *testing.T) {
	t.Parallel()
	b := setup(t, natstest.Start(t))
	keys, err := whsecret.ParseKeys("a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=")
	require.NoError(t, err)
	ws, err := webhooks.NewService(b.pool, notes.Config{}, keys, zerolog.Nop())
	require.NoError(t, err)
	req := func(key string) webhooks.Request {
		return webhooks.Request{Tenant: b.tenant, Key: key, Wait: -1, RenderError: func(err error) []byte { return []byte(`{}`) }}
	}
	p, err := ws.ValidateCreate(webhooks.CreateInput{URL: new("https://example.com/hook"), EventTypes: &[]string{"quill.note.created.v1"}})
	require.NoError(t, err)
	created, err := ws.Create(t.Context(), req("w-create"), p)
	require.NoError(t, err)
	id, err := uuid.Parse(strings.TrimPrefix(created.Resource, contract.WebhooksPath+"/"))
	require.NoError(t, err)
	_, err = ws.RotateSecret(t.Context(), req("w-rotate"), id)
	require.NoError(t, err)
	_, err = ws.Delete(t.Context(), req("w-delete"), id)
	require.NoError(t, err)
	b.create("k1", false)

	rep := b.audit(nil)
	require.Empty(t, rep.Anomalies)
	require.EqualValues(t, 1, rep.Counts.ByAction[contract.ActionCreateWebhook])
	require.EqualValues(t, 1, rep.Counts.ByAction[contract.ActionDeleteWebhook])

	b.exec(`UPDATE webhook_endpoints SET deleted_at = NULL WHERE id = $1`, id)
	b.exec(`UPDATE outbox_events SET operation_key = 'w-create'`)
	rep = b.audit(nil)
	x := requireAnomaly(t, rep, audit.KindMissingEffect, "w-delete", uuid.Nil)
	require.Contains(t, x.Detail, id.String())
	requireAnomaly(t, rep, audit.KindUnexpectedEvent, "w-create", uuid.Nil)
	for _, a := range rep.Anomalies {
		require.NotEqual(t, "w-rotate", a.Key, "the rotation's endpoint exists: %+v", a)
	}
}

// A stream message whose event the database does not have — its
// transaction lost with a primary whose standby had not received it — is a
// lost_event once it is older than the horizon margin; a message younger
// than that (published while the audit read) and a dead letter's re-drive
// of a known event are not.
func TestLostEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	kept := b.create("kept", false)
	lost := b.create("lost", false)
	b.publish()
	keptEv, lostEv := b.eventOf(kept, "note.created"), b.eventOf(lost, "note.created")
	b.publishMsg(keptEv.String()+":redrive:7", b.prefix+"."+b.tenant+".note.created", []byte("{}"))
	// What a failover to an asynchronous standby leaves: the stream has
	// the event, the database not even the operation.
	b.exec(`DELETE FROM outbox_events WHERE aggregate_id = $1`, lost)
	b.exec(`DELETE FROM notes WHERE id = $1`, lost)
	b.exec(`DELETE FROM operations WHERE key = 'lost'`)

	rep := b.audit(nil)
	require.Empty(t, rep.Anomalies, "published a moment ago: within the horizon margin\n%s", text(t, rep))

	rep = b.audit(func(c *audit.Config) { c.Now = func() time.Time { return time.Now().Add(2 * time.Minute) } })
	require.Equal(t, []string{audit.KindLostEvent}, kinds(rep), text(t, rep))
	x := rep.Anomalies[0]
	require.Equal(t, lostEv.String(), x.EventID)
	require.Equal(t, b.tenant, x.Tenant)
	require.Contains(t, x.Detail, "failover")
	require.Contains(t, text(t, rep), audit.KindLostEvent)

	rep = b.audit(func(c *audit.Config) {
		c.Now = func() time.Time { return time.Now().Add(2 * time.Minute) }
		c.Tenant, c.Key = b.tenant, "kept"
	})
	require.Empty(t, rep.Anomalies, "a key's audit does not look for lost events")
}
