package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/contract"
)

// VersionGuard selects what the consumer does with the version a note
// event carries (Event.Version), in its own transaction, against the
// version of the note it applied last — kept per consumer, tenant and note
// in the package's versions table (Migrate). Events without a version
// (attachment.processed, events written before Quill versioned notes) are
// never guarded.
type VersionGuard string

const (
	// VersionsOff, the default, guards nothing: every fresh event reaches
	// the handler, as before versions existed.
	VersionsOff VersionGuard = ""
	// VersionsSkipStale skips an event whose version is not above the
	// note's version the consumer applied: acknowledged, counted
	// ResultStale, no effect. Every other event is applied and the note's
	// version advanced to its. For a consumer that receives only some
	// note types — creates and deletes, say — whose versions have gaps by
	// design.
	VersionsSkipStale VersionGuard = "skip-stale"
	// VersionsInOrder skips what VersionsSkipStale skips and also holds
	// back an event whose version is more than one above the note's
	// version the consumer applied: it is not applied but redelivered
	// after Config.HoldBackDelay (doubled per delivery), counted
	// ResultHeldBack, until its predecessor was applied — or until
	// MaxDeliver, when it becomes a dead letter. A note.updated carries
	// only the fields that changed, so applying version 3 before version 2
	// and then skipping 2 as stale would lose 2's fields; in order, none
	// is lost. For a consumer that receives every note event (created,
	// updated and deleted): versions are contiguous per note.
	VersionsInOrder VersionGuard = "in-order"
)

// ResultStale and ResultHeldBack are results of quill_consumer_messages_total
// (and Item.Result, for the stale) under Config.Versions.
const (
	// ResultStale: the note's version was not newer than the one the
	// consumer applied; no effect, acknowledged.
	ResultStale = "stale"
	// ResultHeldBack: VersionsInOrder held the event back for its
	// predecessor; not applied, Nak'ed for a redelivery after
	// Config.HoldBackDelay.
	ResultHeldBack = "held_back"
)

// DefaultHoldBackDelay is the redelivery delay of an event held back for
// the first time, doubled per delivery up to Config.MaxNakDelay: short,
// since its predecessor is usually in flight.
const DefaultHoldBackDelay = 200 * time.Millisecond

// HeldBackError is why VersionsInOrder held an event back; a dead letter
// written for it at MaxDeliver carries it as DeadLetter.Err.
type HeldBackError struct {
	// Tenant and Note name the note (the event's subject).
	Tenant, Note string
	// Version is the event's.
	Version int64
	// Applied is the note's version the consumer applied last; 0 when it
	// has none, and this process holds an earlier version of the note
	// not yet applied (InFlight).
	Applied int64
	// InFlight is that earlier version, when Applied is 0.
	InFlight int64
	// Unseen: the consumer has no version of the note and this process
	// holds none of its earlier ones, but one may still come back — from
	// a process that fetched it and stopped without acknowledging — within
	// the ack wait (Applied and InFlight are 0).
	Unseen bool
}

func (e *HeldBackError) Error() string {
	if e.Unseen {
		return fmt.Sprintf("held back: version %d of note %s of tenant %s is the first the consumer sees of it; waiting an ack wait for its earlier versions",
			e.Version, e.Note, e.Tenant)
	}
	if e.Applied == 0 {
		return fmt.Sprintf("held back: version %d of note %s of tenant %s, while version %d of it is not yet applied",
			e.Version, e.Note, e.Tenant, e.InFlight)
	}
	return fmt.Sprintf("held back: version %d of note %s of tenant %s follows version %d, the last the consumer applied; waiting for version %d",
		e.Version, e.Note, e.Tenant, e.Applied, e.Applied+1)
}

// isHeldBack reports whether err is, or wraps, a *HeldBackError.
func isHeldBack(err error) bool {
	var h *HeldBackError
	return errors.As(err, &h)
}

// noteKey is the guard's key of a note within one consumer.
type noteKey struct{ tenant, note string }

func keyOf(ev Event) noteKey { return noteKey{ev.Tenant, ev.Subject} }

// inFlight counts, per note, the versions of the deliveries this process
// holds (VersionsInOrder only), from their fetch to their ack or Nak: a
// note the consumer has no version of yet must not take its version 2
// while its version 1 waits in this process — queued behind it, running
// in another transaction, in another batch.
type inFlight struct {
	mu sync.Mutex
	m  map[noteKey]map[int64]int
}

func (f *inFlight) add(k noteKey, v int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[noteKey]map[int64]int{}
	}
	if f.m[k] == nil {
		f.m[k] = map[int64]int{}
	}
	f.m[k][v]++
}

func (f *inFlight) remove(k noteKey, v int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs := f.m[k]
	if vs[v]--; vs[v] <= 0 {
		delete(vs, v)
	}
	if len(vs) == 0 {
		delete(f.m, k)
	}
}

// earlier returns the lowest version below v of note k held, or 0.
func (f *inFlight) earlier(k noteKey, v int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var low int64
	for held := range f.m[k] {
		if held < v && (low == 0 || held < low) {
			low = held
		}
	}
	return low
}

// guardedNote is one note's versioned events in one transaction.
type guardedNote struct {
	key      noteKey
	items    []*Item // by version
	versions []int64 // items' versions
	// applied is the note's version before the transaction, 0 with none;
	// inserted says the lock inserted the row (there was none).
	applied  int64
	inserted bool
	// apply are the items handed to Apply, by version, and their
	// versions.
	apply    []*Item
	applyVer []int64
}

// guardTx is the guard's part of one transaction.
type guardTx struct {
	c     *Consumer
	notes []*guardedNote
}

var noteDeletedType = contract.CloudEventType(contract.EventNoteDeleted)

// guard decides, within tx, which of the fresh items Apply gets: it locks
// (or creates, locked) the versions rows of their notes, marks the stale
// ones (Stale, Result ResultStale), fails those held back (Err a
// *HeldBackError) and those whose version is malformed (Err an
// *InvalidEventError: a dead letter), and returns the rest with each
// note's events in version order, in the place of the note's first
// event. finish writes the notes' new versions after Apply.
func (c *Consumer) guard(ctx context.Context, tx pgx.Tx, todo []*Item) (*guardTx, []*Item, error) {
	g := &guardTx{c: c}
	byKey := map[noteKey]*guardedNote{}
	versioned := map[*Item]bool{}
	for _, it := range todo {
		v, err := it.Event.version()
		switch {
		case err != nil:
			it.Err = &InvalidEventError{Reason: fmt.Sprintf("invalid event: %s %s: %v", it.Event.Type, it.Event.ID, err)}
			continue
		case v == 0:
			continue
		}
		k := keyOf(it.Event)
		n := byKey[k]
		if n == nil {
			n = &guardedNote{key: k}
			byKey[k] = n
			g.notes = append(g.notes, n)
		}
		n.items = append(n.items, it)
		n.versions = append(n.versions, v)
		versioned[it] = true
	}
	if len(g.notes) == 0 {
		return g, withoutErr(todo), nil
	}
	if err := g.lock(ctx, tx); err != nil {
		return nil, nil, err
	}
	for _, n := range g.notes {
		g.decide(n)
	}
	out := make([]*Item, 0, len(todo))
	placed := map[noteKey]bool{}
	for _, it := range todo {
		if it.Err != nil {
			continue
		}
		if !versioned[it] {
			out = append(out, it)
			continue
		}
		n := byKey[keyOf(it.Event)]
		if !placed[n.key] {
			placed[n.key] = true
			out = append(out, n.apply...)
		}
	}
	return g, out, nil
}

func withoutErr(items []*Item) []*Item {
	return slices.DeleteFunc(slices.Clone(items), func(it *Item) bool { return it.Err != nil })
}

// lock reads the notes' versions rows, locked for the transaction, and
// inserts those missing (version 0, replaced or deleted by finish), so
// that a concurrent transaction of the same note waits for this one's
// outcome rather than decide on the same version.
func (g *guardTx) lock(ctx context.Context, tx pgx.Tx) error {
	c := g.c
	tenants, notes := make([]string, len(g.notes)), make([]string, len(g.notes))
	byKey := make(map[noteKey]*guardedNote, len(g.notes))
	for i, n := range g.notes {
		tenants[i], notes[i] = n.key.tenant, n.key.note
		byKey[n.key] = n
	}
	rows, err := tx.Query(ctx, c.store.sql.versionsLock, c.cfg.Durable, tenants, notes, c.cfg.Now().UTC())
	if err != nil {
		return fmt.Errorf("version guard: %w", err)
	}
	var k noteKey
	var v int64
	var inserted bool
	_, err = pgx.ForEachRow(rows, []any{&k.tenant, &k.note, &v, &inserted}, func() error {
		if n := byKey[k]; n != nil {
			n.applied, n.inserted = v, inserted
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("version guard: %w", err)
	}
	return nil
}

// decide sorts n's items by version and sets each one's fate: stale, held
// back, or applied (in n.apply).
func (g *guardTx) decide(n *guardedNote) {
	mode := g.c.cfg.Versions
	idx := make([]int, len(n.items))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(n.versions[a], n.versions[b]) })
	items, versions := make([]*Item, len(idx)), make([]int64, len(idx))
	for i, j := range idx {
		items[i], versions[i] = n.items[j], n.versions[j]
	}
	n.items, n.versions = items, versions

	cur, has := n.applied, !n.inserted
	if mode == VersionsInOrder && !has && versions[0] > 1 {
		// A note this consumer has no version of — it started after the
		// note's first events, or they were written before versions —
		// takes whatever version comes first, unless this process holds
		// an earlier one not yet applied.
		if low := g.c.inflight.earlier(n.key, versions[0]); low > 0 {
			for i, it := range items {
				it.Err = &HeldBackError{Tenant: n.key.tenant, Note: n.key.note, Version: versions[i], InFlight: low}
			}
			return
		}
		// Nor while an earlier version may still be redelivered: a
		// process that fetched it and stopped (killed, say) without
		// acknowledging leaves it to come back within AckWait of its
		// fetch, which was before this event's first delivery. Taking
		// this one as the note's first would make that one stale — its
		// effect (a webhook delivery, an update's fields) lost.
		if g.c.cfg.awaitingEarlier(items[0].Event.Delivery.Deliveries) {
			for i, it := range items {
				it.Err = &HeldBackError{Tenant: n.key.tenant, Note: n.key.note, Version: versions[i], Unseen: true}
			}
			return
		}
	}
	for i, it := range items {
		v := versions[i]
		switch {
		case has && v <= cur:
			it.Stale, it.Result = true, ResultStale
		case mode == VersionsInOrder && has && v > cur+1:
			it.Err = &HeldBackError{Tenant: n.key.tenant, Note: n.key.note, Version: v, Applied: cur}
		default:
			cur, has = v, true
			n.apply, n.applyVer = append(n.apply, it), append(n.applyVer, v)
		}
	}
}

// finish writes, within tx, each note's version after Apply: the highest
// of its applied events, unless one of them failed on its own (Item.Err)
// — then the version before it, and an error when a later version of the
// note was applied after the one that failed (its effect assumed the
// other's: the whole transaction must roll back, and its events be
// handled one by one). The row a lock inserted for a note none of whose
// events applied is deleted.
func (g *guardTx) finish(ctx context.Context, tx pgx.Tx) error {
	c := g.c
	var tenants, notes []string
	var versions []int64
	var deleted []bool
	for _, n := range g.notes {
		final, gone := int64(0), false
		failed := int64(0)
		for i, it := range n.apply {
			v := n.applyVer[i]
			if it.Err != nil {
				if failed == 0 {
					failed = v
				}
				continue
			}
			if failed != 0 {
				return fmt.Errorf("version guard: version %d of note %s failed and version %d was applied after it in the same transaction",
					failed, n.key.note, v)
			}
			final, gone = v, it.Event.Type == noteDeletedType
		}
		if final == 0 && !n.inserted {
			continue // nothing advanced: the row stays as it was
		}
		tenants, notes = append(tenants, n.key.tenant), append(notes, n.key.note)
		versions, deleted = append(versions, final), append(deleted, gone)
	}
	if len(tenants) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, c.store.sql.versionsWrite, c.cfg.Durable, tenants, notes, versions, deleted, c.cfg.Now().UTC()); err != nil {
		return fmt.Errorf("version guard: %w", err)
	}
	return nil
}
