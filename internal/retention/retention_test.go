package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/retention"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
)

// waitLong bounds every wait; the polls end as soon as the condition holds.
const waitLong = 30 * time.Second

// harness is one test's world: a fresh schema and a tenant and inbox
// consumer named uniquely.
type harness struct {
	t      *testing.T
	pool   *pgxpool.Pool
	suffix string
	tenant string
}

func setup(t *testing.T) *harness {
	t.Helper()
	pool, _ := dbtest.Pool(t, 8)
	suffix := testkit.UniqueSuffix()
	return &harness{t: t, pool: pool, suffix: suffix, tenant: "acme-" + suffix}
}

// newCleaner returns a cleaner with the default horizons and batches of
// two, so that every step takes several.
func (h *harness) newCleaner() *retention.Cleaner {
	h.t.Helper()
	c, err := retention.New(h.pool, retention.Config{Batch: 2}, zerolog.Nop())
	require.NoError(h.t, err)
	return c
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	h.t.Cleanup(cancel)
	return ctx
}

// write commits one event in its own transaction and returns its id.
func (h *harness) write(tenant string, note uuid.UUID, typ string) uuid.UUID {
	h.t.Helper()
	ctx := h.ctx()
	e := outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: tenant, AggregateID: note, Type: typ,
		Time: time.Now(), Data: map[string]any{"note_id": note.String()}}
	require.NoError(h.t, db.WithTx(ctx, h.pool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }))
	return e.ID
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.pool.QueryRow(h.ctx(), sql, args...).Scan(&n))
	return n
}

type outboxRow struct{ ID uuid.UUID }

// rows returns the outbox in seq order.
func (h *harness) rows() []outboxRow {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), `SELECT id FROM outbox_events ORDER BY seq`)
	require.NoError(h.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxRow])
	require.NoError(h.t, err)
	return out
}

func TestConfigValidateNamesTheSetting(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		cfg    retention.Config
		stream stream.Config
		want   []string // substrings of the error; nil: valid
	}{
		{name: "defaults cover the default stream"},
		{name: "inbox forgets before the stream does", stream: stream.Config{MaxAge: 400 * time.Hour},
			want: []string{"QUILL_INBOX_RETENTION 336h0m0s", "QUILL_STREAM_MAX_AGE 400h0m0s"}},
		{name: "inbox retention equal to MaxAge", cfg: retention.Config{InboxRetention: 400 * time.Hour}, stream: stream.Config{MaxAge: 400 * time.Hour}},
		{name: "negative outbox retention", cfg: retention.Config{OutboxRetention: -time.Hour}, want: []string{"QUILL_OUTBOX_RETENTION"}},
		{name: "negative batch", cfg: retention.Config{Batch: -1}, want: []string{"batch must be positive"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg.WithDefaults()
			err := cfg.CoversStream(tc.stream.WithDefaults())
			if err == nil {
				err = cfg.Validate()
			}
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
	_, err := retention.New(nil, retention.Config{OutboxRetention: -time.Hour}, zerolog.Nop())
	require.ErrorContains(t, err, "QUILL_OUTBOX_RETENTION", "New refuses what Validate refuses")
}

// Run cleans at once, again every interval, and returns nil when its
// context ends.
func TestRunCleansUntilCancelled(t *testing.T) {
	t.Parallel()
	h := setup(t)
	c, err := retention.New(h.pool, retention.Config{Interval: 20 * time.Millisecond}, zerolog.Nop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(h.ctx())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	id := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	_, err = h.pool.Exec(h.ctx(), `UPDATE outbox_events SET published_at = now() - interval '169 hours', stream_seq = seq,
		created_at = now() - interval '170 hours' WHERE id = $1`, id)
	require.NoError(t, err)
	testkit.WaitFor(t, waitLong, func() bool { return h.count(`SELECT count(*) FROM outbox_events`) == 0 },
		"a pass deletes the event published past the retention")
	cancel()
	testkit.RequireReturned(t, done, waitLong)
}

// TestCleanupHonoursRetention deletes published events older than the
// outbox retention in small batches, keeps recent and unpublished ones,
// compacts and forgets operation records past their horizons, and deletes
// old inbox rows and the version guard's rows of notes deleted long ago —
// with two cleaners at once.
func TestCleanupHonoursRetention(t *testing.T) {
	t.Parallel()
	h := setup(t)
	a, b := h.newCleaner(), h.newCleaner()
	ctx := h.ctx()

	age := func(id uuid.UUID, ago string) {
		// Created a second before it was published, as for real: cleanup
		// walks the outbox in seq order and stops at events too young.
		_, err := h.pool.Exec(ctx, `UPDATE outbox_events SET published_at = now() - $2::interval, stream_seq = seq,
			created_at = now() - $2::interval - interval '1 second' WHERE id = $1`, id, ago)
		require.NoError(t, err)
	}
	var old []uuid.UUID
	for range 5 {
		id := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
		age(id, "169 hours")
		old = append(old, id)
	}
	recent := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	age(recent, "167 hours")
	pending := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	oldPending := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	_, err := h.pool.Exec(ctx, `UPDATE outbox_events SET created_at = now() - interval '400 hours' WHERE id = $1`, oldPending)
	require.NoError(t, err)

	// Operation records: one past its key retention, one past its response
	// retention only, one fresh. (Their note.created events stay pending.)
	svc, err := notes.NewService(h.pool, notes.Config{}, zerolog.Nop())
	require.NoError(t, err)
	for _, key := range []string{"forgotten", "compacted", "fresh"} {
		_, err := svc.Create(ctx, notes.Request{Tenant: h.tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: key})
		require.NoError(t, err)
	}
	_, err = h.pool.Exec(ctx, `UPDATE operations SET expires_at = now() - interval '1 hour', forget_at = now() - interval '1 minute' WHERE key = 'forgotten'`)
	require.NoError(t, err)
	_, err = h.pool.Exec(ctx, `UPDATE operations SET expires_at = now() - interval '1 hour' WHERE key = 'compacted'`)
	require.NoError(t, err)
	keep := []uuid.UUID{recent, pending, oldPending}
	rows, err := h.pool.Query(ctx, `SELECT id FROM outbox_events WHERE operation_key IS NOT NULL`)
	require.NoError(t, err)
	opEvents, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.Len(t, opEvents, 3)
	keep = append(keep, opEvents...)

	// Inbox rows: three past the inbox retention (336h), one within it.
	// (Written directly: the inbox's own writers run in a consumer's
	// processing transaction.)
	for i, ago := range []time.Duration{337 * time.Hour, 400 * time.Hour, 1000 * time.Hour, 335 * time.Hour} {
		_, err := h.pool.Exec(ctx, `INSERT INTO quill_consumer_inbox (consumer, event_id, event_type, stream_seq, deliveries, processed_at) VALUES ($1, $2, '', 0, 1, $3)`,
			"worker-"+h.suffix, uuid.New(), time.Now().Add(-ago))
		require.NoError(t, err, "inbox row %d", i)
	}

	// Version-guard rows: a note deleted 337h ago (forgotten), one deleted
	// 335h ago and a live note last changed 1000h ago (both kept: a live
	// note's row is what orders its next events).
	guardConsumer := "webhook-dispatcher-" + h.suffix
	for _, r := range []struct {
		note    string
		deleted bool
		ago     time.Duration
	}{{"gone", true, 337 * time.Hour}, {"recently-gone", true, 335 * time.Hour}, {"live", false, 1000 * time.Hour}} {
		_, err := h.pool.Exec(ctx, `INSERT INTO quill_consumer_versions (consumer, tenant, note_id, version, deleted, applied_at) VALUES ($1, $2, $3, 3, $4, $5)`,
			guardConsumer, h.tenant, r.note, r.deleted, time.Now().Add(-r.ago))
		require.NoError(t, err, "versions row %s", r.note)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.Clean(gctx) })
	g.Go(func() error { return b.Clean(gctx) })
	require.NoError(t, g.Wait())

	var left []uuid.UUID
	for _, r := range h.rows() {
		left = append(left, r.ID)
	}
	for _, id := range old {
		require.NotContains(t, left, id, "published 169h ago: deleted")
	}
	require.ElementsMatch(t, keep, left,
		"published events past the retention are deleted; recent and unpublished ones stay")
	require.Zero(t, h.count(`SELECT count(*) FROM operations WHERE key = 'forgotten'`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM operations WHERE key = 'compacted' AND response_body IS NULL AND compacted_at IS NOT NULL`),
		"a record past its response retention is compacted to a tombstone")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM operations WHERE key = 'fresh' AND response_body IS NOT NULL AND compacted_at IS NULL`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM quill_consumer_inbox WHERE consumer = $1`, "worker-"+h.suffix),
		"only the inbox row within the retention is kept")
	rows, err = h.pool.Query(ctx, `SELECT note_id FROM quill_consumer_versions WHERE consumer = $1`, guardConsumer)
	require.NoError(t, err)
	guarded, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"recently-gone", "live"}, guarded,
		"the guard forgets a note deleted past the inbox retention and keeps the rest")

	// Nothing left to do is not an error.
	require.NoError(t, a.Clean(ctx))
	require.Len(t, h.rows(), len(keep))
}

// Clean walks the outbox from its oldest event; old events that must
// stay — parked or still pending — fill whole windows at its head without
// stopping the walk, and the published events behind them are deleted.
func TestCleanupStepsOverOldUnpublishedEvents(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.newCleaner()
	ctx := h.ctx()
	set := func(id uuid.UUID, sql string) {
		_, err := h.pool.Exec(ctx, `UPDATE outbox_events SET `+sql+` WHERE id = $1`, id)
		require.NoError(t, err)
	}
	var stay, gone []uuid.UUID
	for i := range 5 {
		id := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
		set(id, `created_at = now() - interval '500 hours'`)
		if i%2 == 0 {
			set(id, `parked_at = now(), parked_reason = 'payload too large'`)
		}
		stay = append(stay, id)
	}
	for range 3 {
		id := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
		set(id, `created_at = now() - interval '300 hours', published_at = now() - interval '299 hours', stream_seq = seq`)
		gone = append(gone, id)
	}
	young := h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
	set(young, `published_at = now(), stream_seq = seq`)
	stay = append(stay, young)

	require.NoError(t, r.Clean(ctx))
	var left []uuid.UUID
	for _, row := range h.rows() {
		left = append(left, row.ID)
	}
	require.ElementsMatch(t, stay, left, "the three old published events behind five old unpublished ones are deleted")
	for _, id := range gone {
		require.NotContains(t, left, id)
	}
}
