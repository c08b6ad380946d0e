package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/wait"
)

// streamFetchBatch is how many message headers one fetch of the duplicate
// scan asks for.
const streamFetchBatch = 512

// streamFetchWait bounds one fetch of the duplicate scan.
const streamFetchWait = 2 * time.Second

// checkStream compares every published event with the message at its stream
// sequence (GetMsg, Nats-Msg-Id and subject), and scans the scope's subjects
// (headers only) for two messages with one Nats-Msg-Id. The stream being
// unreachable or missing is reported in the report, not returned: the audit
// then is incomplete (Report.Complete). Other errors are returned.
func (a *auditor) checkStream(ctx context.Context, js jetstream.JetStream) error {
	si := &a.rep.Stream
	st, err := js.Stream(ctx, a.cfg.Stream.Name)
	if err != nil {
		si.Reason = fmt.Sprintf("stream %s is not available: %v", a.cfg.Stream.Name, err)
		a.note("stream not checked: " + si.Reason)
		return nil
	}
	info := st.CachedInfo()
	maxAge := info.Config.MaxAge
	si.FirstSeq, si.LastSeq = info.State.FirstSeq, info.State.LastSeq
	if maxAge > 0 {
		a.rep.Horizons.StreamMaxAge = maxAge.String()
	}
	agedNoted := false
	for _, e := range a.ds.events {
		if e.PublishedAt == nil || e.StreamSeq == nil {
			continue
		}
		seq := uint64(*e.StreamSeq)
		subject := contract.Subject(a.cfg.Stream.SubjectPrefix, e.Tenant, e.Type)
		base := Anomaly{Tenant: e.Tenant, Key: e.OpKey, EventID: e.ID.String(), NoteID: e.AggregateID.String(), StreamSeq: e.StreamSeq}
		if base.Key == "" {
			base.Key = a.keyOfNote(e.Tenant, e.AggregateID)
		}
		m, err := st.GetMsg(ctx, seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			if maxAge > 0 && !a.within(*e.PublishedAt, maxAge) {
				e.stream = "aged_out"
				si.AgedOut++
				if !agedNoted {
					agedNoted = true
					a.note(fmt.Sprintf("published events older than the stream's MaxAge of %s are no longer in the stream; they were not compared (see stream.aged_out)", maxAge))
				}
				continue
			}
			e.stream = "missing"
			x := base
			x.Kind = KindStreamMissing
			x.Detail = fmt.Sprintf("%s event marked published %s ago at stream sequence %d, which holds no message (stream %s keeps %d..%d, MaxAge %s): the stream lost it or was purged or recreated",
				e.Type, a.now.Sub(*e.PublishedAt).Round(time.Second), seq, a.cfg.Stream.Name, si.FirstSeq, si.LastSeq, maxAgeString(maxAge))
			a.add(x)
		case err != nil:
			return a.streamFailed(fmt.Errorf("read stream %s at sequence %d: %w", a.cfg.Stream.Name, seq, err))
		default:
			got := m.Header.Get(jetstream.MsgIDHeader)
			if got != e.ID.String() || m.Subject != subject {
				e.stream = "mismatch"
				x := base
				x.Kind = KindStreamMismatch
				x.Detail = fmt.Sprintf("%s event marked published at stream sequence %d, which holds message %q on %s instead of %s on %s",
					e.Type, seq, got, m.Subject, e.ID, subject)
				a.add(x)
				continue
			}
			e.stream = "ok"
			si.Verified++
		}
	}
	if err := a.scanDuplicates(ctx, st); err != nil {
		return a.streamFailed(err)
	}
	si.Checked = true
	return nil
}

// streamFailed records a stream failure in the middle of the check: the
// audit is incomplete, not failed, when NATS went away.
func (a *auditor) streamFailed(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	a.rep.Stream.Checked = false
	a.rep.Stream.Reason = err.Error()
	a.note("stream check incomplete: " + err.Error())
	return nil
}

func maxAgeString(d time.Duration) string {
	if d <= 0 {
		return "unlimited"
	}
	return d.String()
}

// scanDuplicates reads the headers of every message on the scope's subjects
// with an ordered consumer and reports each event id stored more than once.
// A dead letter's re-drive carries its own Nats-Msg-Id and is not one.
func (a *auditor) scanDuplicates(ctx context.Context, st jetstream.Stream) error {
	filter := contract.AllSubjects(a.cfg.Stream.SubjectPrefix)
	if a.cfg.Tenant != "" {
		filter = contract.TenantSubjects(a.cfg.Stream.SubjectPrefix, a.cfg.Tenant)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return fmt.Errorf("stream %s info: %w", a.cfg.Stream.Name, err)
	}
	var total uint64
	for _, n := range info.State.Subjects {
		total += n
	}
	if total == 0 {
		return nil
	}
	var (
		seqs     map[string][]uint64
		subjects map[string]string
		stamps   map[string]time.Time
		read     uint64
	)
	for attempt := 1; ; attempt++ {
		seqs, subjects, stamps, read, err = scanHeaders(ctx, st, filter, total)
		// In a cluster a new consumer's interest can reach the client's
		// node a moment after the consumer exists; the first pull then
		// finds no responder. A fresh consumer a moment later is fine.
		if !errors.Is(err, nats.ErrNoResponders) || attempt == noRespondersAttempts || !wait.For(ctx, time.Duration(attempt)*100*time.Millisecond) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("scan stream %s: %w", a.cfg.Stream.Name, err)
	}
	a.rep.Stream.Scanned = int64(read)
	inScope := map[string]*eventRow{}
	for _, e := range a.ds.events {
		inScope[e.ID.String()] = e
	}
	var ids []string
	for id, s := range seqs {
		if len(s) > 1 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		e := inScope[id]
		if a.cfg.Key != "" && e == nil {
			continue // another key's
		}
		s := seqs[id]
		x := Anomaly{Kind: KindDuplicateStreamMessage, Tenant: contract.SubjectTenant(a.cfg.Stream.SubjectPrefix, subjects[id]), EventID: id,
			Detail: fmt.Sprintf("the stream holds %d messages with event id %s, at sequences %v (republished after the duplicate window)", len(s), id, s)}
		if e != nil {
			x.Key, x.NoteID = e.OpKey, e.AggregateID.String()
			if x.Key == "" {
				x.Key = a.keyOfNote(e.Tenant, e.AggregateID)
			}
		}
		a.add(x)
	}
	a.checkLost(inScope, seqs, subjects, stamps)
	return nil
}

// checkLost reports each stream message that no event of the database
// explains (KindLostEvent): an outbox row, or an operation's cleaned event,
// under its id (a dead letter's re-drive under its original's). Only
// messages published within the outbox retention, whose rows the cleanup
// cannot have deleted, and before the audit began (less the horizon
// margin, for the clocks of NATS and this host), whose events must be in
// the database snapshot the audit read. A key's audit does not look: it
// reads one key's events. inScope is the events by id, as scanDuplicates
// indexed them.
func (a *auditor) checkLost(inScope map[string]*eventRow, seqs map[string][]uint64, subjects map[string]string, stamps map[string]time.Time) {
	if a.cfg.Key != "" {
		return
	}
	cleaned := map[string]bool{}
	for _, o := range a.ds.ops {
		for _, k := range o.Cleaned {
			cleaned[k.ID.String()] = true
		}
	}
	var ids []string
	for id := range seqs {
		original, _, _ := strings.Cut(id, ":redrive:")
		at := stamps[id]
		if inScope[original] != nil || cleaned[original] || !a.within(at, a.cfg.OutboxRetention) || at.After(a.now.Add(-a.cfg.HorizonMargin)) {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		s := seqs[id]
		a.add(Anomaly{Kind: KindLostEvent, Tenant: contract.SubjectTenant(a.cfg.Stream.SubjectPrefix, subjects[id]), EventID: id,
			Detail: fmt.Sprintf("the stream holds event %s on %s at sequence %d, published %s ago, which the database does not have (no outbox row, no cleaned event): "+
				"the transaction that wrote it is gone — a failover to a standby that had not received it, or a restore to an earlier point — and consumers may have applied it",
				id, subjects[id], s[0], a.now.Sub(stamps[id]).Round(time.Second))})
	}
}

// noRespondersAttempts bounds the scans that scanDuplicates starts over when
// the stream's first pull finds no responder.
const noRespondersAttempts = 5

// scanHeaders reads the headers of the (about total) messages on filter with
// a new ordered consumer: the stream sequences, subject and first
// publication time of each event id, and how many messages it read.
func scanHeaders(ctx context.Context, st jetstream.Stream, filter string, total uint64) (map[string][]uint64, map[string]string, map[string]time.Time, uint64, error) {
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, HeadersOnly: true, DeliverPolicy: jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, nil, nil, 0, err
	}
	seqs := map[string][]uint64{}
	subjects := map[string]string{}
	stamps := map[string]time.Time{}
	var read uint64
	for read < total {
		batch, err := cons.Fetch(streamFetchBatch, jetstream.FetchMaxWait(streamFetchWait))
		if err != nil {
			return nil, nil, nil, 0, err
		}
		n := 0
		caughtUp := false
		for m := range batch.Messages() {
			n++
			read++
			meta, err := m.Metadata()
			if err != nil {
				return nil, nil, nil, 0, err
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if id != "" {
				if len(seqs[id]) == 0 {
					stamps[id] = meta.Timestamp
				}
				seqs[id] = append(seqs[id], meta.Sequence.Stream)
				subjects[id] = m.Subject()
			}
			if meta.NumPending == 0 {
				caughtUp = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, nil, nil, 0, err
		}
		if n == 0 || caughtUp {
			break // caught up (messages aged out since the count)
		}
	}
	return seqs, subjects, stamps, read, nil
}
