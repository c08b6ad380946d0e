package consumer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
)

const at = "2026-12-01T10:00:00.000000Z"

// noteData is the data Quill writes for a note event of version v: a
// create's note, an update's changed fields (title here), a delete's
// time. It is what the schemas of api/schemas describe.
func noteData(typ, note string, v int64) map[string]any {
	switch typ {
	case contract.EventNoteCreated:
		return map[string]any{"id": note, "title": "t1", "body": "b", "created_at": at, "attachment": nil, "version": v, "updated_at": at}
	case contract.EventNoteUpdated:
		return map[string]any{"id": note, "version": v, "title": "t" + string(rune('0'+v%10)), "updated_at": at}
	case contract.EventNoteDeleted:
		return map[string]any{"id": note, "deleted_at": at, "version": v}
	}
	return map[string]any{"note_id": note, "attachment_id": uuid.NewString(), "state": "processed", "detected_type": "text/plain"}
}

// note publishes a versioned event of note (v 0: without a version, as
// written before Quill versioned notes) and returns its id.
func (b *bundle) note(typ, note string, v int64) string {
	b.t.Helper()
	data := noteData(typ, note, v)
	if v == 0 {
		delete(data, "version")
		delete(data, "updated_at")
	}
	return b.publishData(typ, note, uuid.NewString(), data)
}

// publishData publishes an event of type typ about note with id and data.
func (b *bundle) publishData(typ, note, id string, data any) string {
	b.t.Helper()
	p, err := json.Marshal(map[string]any{
		"specversion": "1.0", "id": id, "source": "/tenants/" + b.tenant, "type": contract.CloudEventType(typ), "subject": note,
		"time": at, "datacontenttype": "application/json", "dataschema": contract.DataSchemaPrefix + contract.CloudEventType(typ),
		"data": data,
	})
	require.NoError(b.t, err)
	b.publish(contract.Subject("quill", b.tenant, typ), id+":"+uuid.NewString(), p)
	return id
}

// guardConfig is a test consumer's configuration with the version guard:
// schemas checked, quick hold-backs.
func (b *bundle) guardConfig(mode consumer.VersionGuard) consumer.Config {
	cfg := b.config()
	validate, err := consumer.SchemaValidator()
	require.NoError(b.t, err)
	cfg.Validate, cfg.Versions, cfg.HoldBackDelay = validate, mode, 20*time.Millisecond
	return cfg
}

// recordVersion is the effect handler of the guard's tests: one row per
// event, with the event's version (0 for none) in seq.
func recordVersion(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
	v, _ := ev.Version()
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id, subject, seq) VALUES ($1, $2, $3)`, ev.ID, ev.Subject, v)
	return err
}

// applied returns note's effects' versions, in the order they committed.
func (b *bundle) applied(note string) []int64 {
	b.t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT seq FROM effects WHERE subject = $1 ORDER BY n`, note)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(b.t, err)
	return out
}

// row returns the guard's row of note for durable: its version and
// whether it is deleted; -1 when there is none.
func (b *bundle) row(durable, note string) (int64, bool) {
	b.t.Helper()
	var v int64
	var deleted bool
	err := b.pool.QueryRow(context.Background(), `SELECT version, deleted FROM quill_consumer_versions WHERE consumer = $1 AND tenant = $2 AND note_id = $3`,
		durable, b.tenant, note).Scan(&v, &deleted)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1, false
	}
	require.NoError(b.t, err)
	return v, deleted
}

// VersionsSkipStale applies what is newer, gaps included, skips what is
// not — acknowledged, counted stale, Item.Stale and Result "stale" for
// Committed, its inbox row kept — and leaves events without a version
// alone.
func TestVersionGuardSkipsStale(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsSkipStale)
	cfg.Concurrency = 1 // stream order
	var mu sync.Mutex
	results := map[string]string{}
	b.startStaged(cfg, consumer.Stages{
		Apply: func(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
			for _, it := range items {
				if err := recordVersion(ctx, tx, it.Event); err != nil {
					return err
				}
			}
			return nil
		},
		Committed: func(items []*consumer.Item) {
			mu.Lock()
			defer mu.Unlock()
			for _, it := range items {
				require.Equal(t, it.Result == consumer.ResultStale, it.Stale)
				results[it.Event.ID] = it.Result
			}
		},
	})
	note, old := uuid.NewString(), uuid.NewString()
	b.note(contract.EventNoteCreated, note, 1)
	b.note(contract.EventNoteUpdated, note, 3)
	stale := b.note(contract.EventNoteUpdated, note, 2)
	b.note(contract.EventAttachmentProcessed, note, 0)
	b.note(contract.EventNoteDeleted, note, 4)
	b.note(contract.EventNoteCreated, old, 0)
	b.note(contract.EventNoteDeleted, old, 0)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 6)
	waitMetric(t, cfg.Registerer, consumer.ResultStale, 1)
	b.settled(cfg.Durable)

	require.Equal(t, []int64{1, 3, 0, 4}, b.applied(note), "the gap applied, the stale version skipped")
	require.Equal(t, []int64{0, 0}, b.applied(old), "no version, no guard")
	v, deleted := b.row(cfg.Durable, note)
	require.Equal(t, int64(4), v)
	require.True(t, deleted)
	v, _ = b.row(cfg.Durable, old)
	require.EqualValues(t, -1, v, "no row for a note without versions")
	require.Equal(t, 7, b.count(`SELECT count(*) FROM quill_consumer_inbox`), "the stale event is remembered: a copy is a duplicate")
	require.Equal(t, 0.0, metric(t, cfg.Registerer, consumer.ResultHeldBack))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, consumer.ResultStale, results[stale])
}

// VersionsInOrder holds back a version that comes before its predecessor
// — redelivered after the hold-back delay, counted held_back — and
// applies it once the predecessor was applied: the note's events take
// effect in version order. A copy of an applied version the inbox no
// longer knows is stale.
func TestVersionGuardInOrderHoldsBackWhatComesEarly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsInOrder)
	cfg.Concurrency = 1 // stream order: the early one first
	b.start(cfg, recordVersion)
	note := uuid.NewString()
	b.note(contract.EventNoteCreated, note, 1)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 1)
	early := b.note(contract.EventNoteUpdated, note, 3)
	second := b.note(contract.EventNoteUpdated, note, 2)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 3)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{1, 2, 3}, b.applied(note))
	require.GreaterOrEqual(t, metric(t, cfg.Registerer, consumer.ResultHeldBack), 1.0)
	require.Equal(t, 0.0, metric(t, cfg.Registerer, consumer.ResultFailed), "a hold-back is not a failure")
	require.GreaterOrEqual(t, b.count(`SELECT deliveries FROM quill_consumer_inbox WHERE event_id = $1`, early), 2,
		"applied on a redelivery")
	v, deleted := b.row(cfg.Durable, note)
	require.Equal(t, int64(3), v)
	require.False(t, deleted)

	// The inbox forgot version 2 (its retention), and a copy comes.
	_, err := b.pool.Exec(t.Context(), `DELETE FROM quill_consumer_inbox WHERE event_id = $1`, second)
	require.NoError(t, err)
	b.publishData(contract.EventNoteUpdated, note, second, noteData(contract.EventNoteUpdated, note, 2))
	waitMetric(t, cfg.Registerer, consumer.ResultStale, 1)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{1, 2, 3}, b.applied(note))
}

// A note the consumer has no version of takes whatever version comes
// first (a consumer that started after the note's first events) — once it
// has waited 1.5 × AckWait for an earlier one; the versions after it follow
// the rules.
func TestVersionGuardNoteWithoutARowTakesAnyVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsInOrder)
	cfg.Concurrency = 1
	b.start(cfg, recordVersion)
	note := uuid.NewString()
	b.note(contract.EventNoteUpdated, note, 5)
	require.Eventually(t, func() bool { return metric(t, cfg.Registerer, consumer.ResultHeldBack) >= 1 }, waitLong, tick, "5 held back first")
	b.note(contract.EventNoteDeleted, note, 6)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 2)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{5, 6}, b.applied(note))
}

// A note's earlier version that comes back after a later one — fetched by
// a process that stopped without acknowledging it, redelivered after the
// ack wait, while the later one went to the process after it — is not
// made stale by the later one: the later one, the first the consumer sees
// of the note, waits (held back) for the earlier, and both apply in order.
// (Without the wait the later version took the note and the earlier one
// was skipped: a webhook dispatcher lost its delivery.)
func TestVersionGuardNoteWithoutARowWaitsForAnEarlierVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsInOrder)
	cfg.Concurrency = 1
	b.start(cfg, recordVersion)
	note := uuid.NewString()
	b.note(contract.EventNoteUpdated, note, 2)
	require.Eventually(t, func() bool { return metric(t, cfg.Registerer, consumer.ResultHeldBack) >= 1 }, waitLong, tick, "2 held back first")
	b.note(contract.EventNoteCreated, note, 1)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 2)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{1, 2}, b.applied(note), "both, in version order")
	require.Zero(t, metric(t, cfg.Registerer, consumer.ResultStale), "nothing stale")
}

// The guard's row is written in the handler's transaction: an effect that
// fails rolls it back too, so the note's version stays; the version after
// it, held back on every delivery, becomes a dead letter at MaxDeliver
// whose cause is a *HeldBackError.
func TestVersionGuardRollsBackWithTheEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsInOrder)
	cfg.Concurrency, cfg.MaxDeliver = 1, 3
	dl := &letters{}
	cfg.DeadLetters = dl
	note := uuid.NewString()
	b.start(cfg, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		if err := recordVersion(ctx, tx, ev); err != nil {
			return err
		}
		if v, _ := ev.Version(); v == 2 {
			return consumer.Permanent(errors.New("the effect of version 2 cannot be applied"))
		}
		return nil
	})
	b.note(contract.EventNoteCreated, note, 1)
	b.note(contract.EventNoteUpdated, note, 2)
	third := b.note(contract.EventNoteUpdated, note, 3)
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 2)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{1}, b.applied(note), "version 2's effect rolled back, version 3 never applied")
	v, _ := b.row(cfg.Durable, note)
	require.Equal(t, int64(1), v, "the row rolled back with the effect")
	require.Equal(t, 2.0, metric(t, cfg.Registerer, consumer.ResultHeldBack), "held back on deliveries 1 and 2")
	dl.mu.Lock()
	defer dl.mu.Unlock()
	require.Len(t, dl.got, 2)
	held := dl.got[1]
	require.Equal(t, third, held.Event.ID)
	var hb *consumer.HeldBackError
	require.ErrorAs(t, held.Err, &hb)
	require.Equal(t, consumer.HeldBackError{Tenant: b.tenant, Note: note, Version: 3, Applied: 1}, *hb)
	require.Contains(t, held.Reason, "delivery 3 of at most 3: held back: version 3 of note "+note)
	require.Contains(t, held.Reason, "waiting for version 2")
}

// A version that is not a positive integer is a dead letter at once: the
// guard cannot place it.
func TestVersionGuardRefusesAMalformedVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config() // no schema check: the guard's own
	cfg.Versions = consumer.VersionsSkipStale
	b.start(cfg, recordVersion)
	note := uuid.NewString()
	b.publishData(contract.EventNoteUpdated, note, uuid.NewString(), map[string]any{"id": note, "version": "2", "updated_at": at})
	waitMetric(t, cfg.Registerer, consumer.ResultDeadLettered, 1)
	b.settled(cfg.Durable)
	dl := b.deadLetters()
	require.Len(t, dl, 1)
	require.Contains(t, dl[0].Reason, `data.version "2" is not a positive integer`)
	require.Empty(t, b.applied(note))
	require.Zero(t, b.count(`SELECT count(*) FROM quill_consumer_versions`))
	require.Zero(t, b.count(`SELECT count(*) FROM quill_consumer_inbox`))
}

// blocked starts a staged batch consumer whose first batch — the blocker
// event — waits in Apply until release is closed, so that the events
// published meanwhile gather in the next batch. calls logs each Apply
// call's events as "<version>" per note, in the order Apply got them.
type blocked struct {
	b       *bundle
	cfg     consumer.Config
	blocker string
	release chan struct{}
	running atomic.Bool

	mu    sync.Mutex
	calls [][]string
	// fail, when set, is the Err Apply sets on the item it names.
	fail func(ev consumer.Event, attempt int) error
	seen map[string]int
}

func (b *bundle) blocked(cfg consumer.Config) *blocked {
	cfg.MaxConcurrentBatches = 1
	bl := &blocked{b: b, cfg: cfg, release: make(chan struct{}), seen: map[string]int{}}
	bl.blocker = b.note(contract.EventAttachmentProcessed, uuid.NewString(), 0)
	b.startStaged(cfg, consumer.Stages{Apply: bl.apply})
	require.Eventually(b.t, bl.running.Load, waitLong, tick, "the blocker's batch committing")
	return bl
}

func (bl *blocked) apply(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
	if items[0].Event.ID == bl.blocker {
		bl.running.Store(true)
		<-bl.release
	}
	var call []string
	for _, it := range items {
		bl.mu.Lock()
		bl.seen[it.Event.ID]++
		attempt := bl.seen[it.Event.ID]
		bl.mu.Unlock()
		if v, ok := it.Event.Version(); ok {
			call = append(call, it.Event.Subject[:4]+string(rune('0'+v)))
		}
		if bl.fail != nil {
			if it.Err = bl.fail(it.Event, attempt); it.Err != nil {
				continue
			}
		}
		if err := recordVersion(ctx, tx, it.Event); err != nil {
			return err
		}
	}
	bl.mu.Lock()
	bl.calls = append(bl.calls, call)
	bl.mu.Unlock()
	return nil
}

// waitHeld waits until n deliveries besides the blocker's are held.
func (bl *blocked) waitHeld(n int) {
	bl.b.t.Helper()
	require.Eventually(bl.b.t, func() bool {
		return gauge(bl.b.t, bl.cfg.Registerer, "quill_consumer_handlers_running") == float64(1+n)
	},
		waitLong, tick, "every delivery held")
}

// In one batch each note's events reach Apply in version order, in the
// place of the note's first event, whatever order they came in; a note
// with no version yet starts at its lowest.
func TestVersionGuardOrdersANotesEventsInABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsInOrder)
	cfg.Concurrency, cfg.MaxBatch, cfg.MaxBatchWait = 32, 32, time.Nanosecond
	a, c := "aaaa"+uuid.NewString()[4:], "cccc"+uuid.NewString()[4:]
	bl := b.blocked(cfg)
	b.note(contract.EventNoteUpdated, a, 3)
	b.note(contract.EventNoteUpdated, c, 2)
	b.note(contract.EventNoteCreated, a, 1)
	b.note(contract.EventNoteUpdated, a, 2)
	b.note(contract.EventNoteCreated, c, 1)
	bl.waitHeld(5)
	close(bl.release)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 6)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{1, 2, 3}, b.applied(a))
	require.Equal(t, []int64{1, 2}, b.applied(c))
	bl.mu.Lock()
	defer bl.mu.Unlock()
	// The deliveries are held by concurrent handlers, so which note's
	// first event joins the batch first is the handlers' race: either
	// note may lead, but each note's events stay together, by version.
	require.Len(t, bl.calls, 2)
	require.Nil(t, bl.calls[0], "the blocker's batch")
	require.Contains(t, [][]string{
		{"aaaa1", "aaaa2", "aaaa3", "cccc1", "cccc2"},
		{"cccc1", "cccc2", "aaaa1", "aaaa2", "aaaa3"},
	}, bl.calls[1])
	require.Equal(t, 0.0, metric(t, cfg.Registerer, consumer.ResultHeldBack))
}

// When a note's version fails on its own in a batch whose later version
// of that note applied, the whole batch rolls back (the later effect
// assumed the earlier), and its events are handled one by one: in the
// end, in version order, nothing lost.
func TestVersionGuardFallsBackWhenAnEarlierVersionFailsInTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsInOrder)
	cfg.Concurrency, cfg.MaxBatch, cfg.MaxBatchWait = 32, 32, time.Nanosecond
	note := uuid.NewString()
	bl := b.blocked(cfg)
	bl.fail = func(ev consumer.Event, attempt int) error {
		if v, _ := ev.Version(); v == 2 && attempt == 1 {
			return errors.New("version 2 fails once")
		}
		return nil
	}
	b.note(contract.EventNoteCreated, note, 1)
	b.note(contract.EventNoteUpdated, note, 2)
	b.note(contract.EventNoteUpdated, note, 3)
	bl.waitHeld(3)
	close(bl.release)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 4)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{1, 2, 3}, b.applied(note))
	n, _ := batches(t, cfg.Registerer, "fell_back")
	require.EqualValues(t, 1, n, "the batch fell back")
	v, _ := b.row(cfg.Durable, note)
	require.Equal(t, int64(3), v)
}

// A note the consumer has no version of does not take its version 2
// while this process holds its version 1, not yet applied (here still in
// Prepare): version 2 is held back until version 1 is applied.
func TestVersionGuardWaitsForAnEarlierVersionThisProcessHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.guardConfig(consumer.VersionsInOrder)
	cfg.MaxBatch = 1 // each alone, concurrently
	note := uuid.NewString()
	first := b.note(contract.EventNoteCreated, note, 1)
	preparing, release := make(chan struct{}), make(chan struct{})
	b.startStaged(cfg, consumer.Stages{
		Prepare: func(_ context.Context, items []*consumer.Item) {
			if items[0].Event.ID == first {
				close(preparing)
				<-release
			}
		},
		Apply: func(ctx context.Context, tx pgx.Tx, items []*consumer.Item) error {
			return recordVersion(ctx, tx, items[0].Event)
		},
	})
	<-preparing
	b.note(contract.EventNoteUpdated, note, 2)
	waitMetric(t, cfg.Registerer, consumer.ResultHeldBack, 1)
	require.Empty(t, b.applied(note))
	v, _ := b.row(cfg.Durable, note)
	require.EqualValues(t, -1, v, "the row the held-back event's lock inserted is gone")
	close(release)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 2)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{1, 2}, b.applied(note))
}

// Without Config.Versions nothing is guarded: a stale version applies,
// no row is written, and the guard's results are not exported.
func TestVersionGuardIsOffByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Concurrency = 1
	b.start(cfg, recordVersion)
	note := uuid.NewString()
	b.note(contract.EventNoteUpdated, note, 3)
	b.note(contract.EventNoteUpdated, note, 2)
	waitMetric(t, cfg.Registerer, consumer.ResultProcessed, 2)
	b.settled(cfg.Durable)
	require.Equal(t, []int64{3, 2}, b.applied(note))
	require.Zero(t, b.count(`SELECT count(*) FROM quill_consumer_versions`))
	mfs, err := cfg.Registerer.(prometheus.Gatherer).Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				require.NotContains(t, []string{consumer.ResultStale, consumer.ResultHeldBack}, l.GetValue(), mf.GetName())
			}
		}
	}
}
