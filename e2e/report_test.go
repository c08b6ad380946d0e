package e2e

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// figures are a run's numbers: what was asked, what happened, what each
// layer suppressed, and which faults fired.
type figures struct {
	profile                  profile
	duration, load, drain    time.Duration
	ops, creates, deletes    int
	updates                  int
	resent, resentAtOnce     int
	requests, transport      int64
	reads                    int64 // GETs clients made to learn a note's version
	statuses                 map[int]int64
	tally                    outcomeTally
	notes, deleted           int
	attProcessed, attSkipped int
	events, streamMsgs       int

	// Scraped from /metrics, summed over incarnations.
	apiHTTP, apiExecuted, apiReplayed, apiInProgress, apiKeyReused float64
	effectsCreate, effectsDelete, effectsUpdate                    float64
	relayPublished, relayDuplicates, relayErrors                   float64
	workerProcessed, workerDuplicate, workerSkipped                float64
	workerFailed, workerDead                                       float64
	incarnations, daemons                                          map[string]int // by program

	// The consumer's own account: deliveries (redeliveries included).
	deliveries, createdMsgs, redeliveries uint64
	// Durable counters in the database, when the schema has them.
	durable map[string]int64

	// Faults.
	kills          map[string]int
	startFailures  map[string]int
	crashes        map[string][]exitRecord
	outages        []time.Duration
	backlogs       []int64
	pgRestarts     int
	relayMarkKills int
	workerAckKills int
	proxy          proxyFigures

	// Per daemon (several of a program), by name.
	relayErrorsBy, relayDuplicatesBy map[string]float64
	relayNames                       []string
	// The cluster run's faults and the stream at the end (nil without a
	// cluster).
	cluster *clusterFigures
}

type proxyFigures struct{ requests, dropped, upstreamErrors int64 }

// figures gathers the numbers after the checks.
func (s *system) figures(ctx context.Context, t *testing.T, p profile, fr faultRunner, lg *loadGen, st *finalState, tally outcomeTally) *figures {
	f := &figures{profile: p, tally: tally, statuses: map[int]int64{}, incarnations: map[string]int{}, daemons: map[string]int{},
		kills: map[string]int{}, startFailures: map[string]int{}, crashes: map[string][]exitRecord{}, durable: map[string]int64{},
		relayErrorsBy: map[string]float64{}, relayDuplicatesBy: map[string]float64{}}
	for _, o := range lg.Ops() {
		f.ops++
		switch o.Kind {
		case opCreate:
			f.creates++
		case opUpdate:
			f.updates++
		default:
			f.deletes++
		}
		if o.Copies > 1 {
			f.resent++
			if o.Concurrent {
				f.resentAtOnce++
			}
		}
	}
	f.requests, f.transport, f.reads = lg.stats.requests.Load(), lg.stats.transport.Load(), lg.stats.reads.Load()
	lg.stats.mu.Lock()
	for k, v := range lg.stats.status {
		f.statuses[k] = v
	}
	lg.stats.mu.Unlock()
	f.notes = len(st.notes)
	for _, n := range st.notes {
		if n.Deleted {
			f.deleted++
		}
	}
	for _, a := range st.atts {
		switch a.Status {
		case "processed", "failed":
			f.attProcessed++
		default:
			f.attSkipped++
		}
	}
	f.events, f.streamMsgs = len(st.events), len(st.stream)
	for _, m := range st.stream {
		if m.Type == "quill.note.created.v1" {
			f.createdMsgs++
		}
	}

	sc := s.scraper
	// total sums a metric over every daemon of a program.
	total := func(ds []*daemon, name string, want map[string]string) float64 {
		n := 0.0
		for _, d := range ds {
			n += sc.Total(d, name, want)
		}
		return n
	}
	f.apiHTTP = total(s.apis, "quill_http_requests_total", nil)
	f.apiExecuted = total(s.apis, "quill_idempotency_requests_total", map[string]string{"outcome": "executed"})
	f.apiReplayed = total(s.apis, "quill_idempotency_requests_total", map[string]string{"outcome": "replayed"})
	f.apiInProgress = total(s.apis, "quill_idempotency_requests_total", map[string]string{"outcome": "in_progress"})
	f.apiKeyReused = total(s.apis, "quill_idempotency_requests_total", map[string]string{"outcome": "key_reused"})
	f.effectsCreate = total(s.apis, "quill_business_effects_total", map[string]string{"action": "create-note"})
	f.effectsDelete = total(s.apis, "quill_business_effects_total", map[string]string{"action": "delete-note"})
	f.effectsUpdate = total(s.apis, "quill_business_effects_total", map[string]string{"action": "update-note"})
	f.relayPublished = total(s.relays, "quill_relay_published_total", nil)
	f.relayDuplicates = total(s.relays, "quill_relay_duplicates_total", nil)
	f.relayErrors = total(s.relays, "quill_relay_publish_errors_total", nil)
	for _, d := range s.relays {
		f.relayNames = append(f.relayNames, d.name)
		f.relayErrorsBy[d.name] = sc.Total(d, "quill_relay_publish_errors_total", nil)
		f.relayDuplicatesBy[d.name] = sc.Total(d, "quill_relay_duplicates_total", nil)
	}
	for _, r := range []struct {
		dst  *float64
		name string
	}{{&f.workerProcessed, "processed"}, {&f.workerDuplicate, "duplicate"}, {&f.workerSkipped, "skipped"},
		{&f.workerFailed, "failed"}, {&f.workerDead, "dead_lettered"}} {
		*r.dst = total(s.workers, "quill_worker_messages_total", map[string]string{"result": r.name})
	}
	// By program: the daemons of one program add up.
	for _, d := range s.daemons() {
		f.daemons[d.role]++
		f.incarnations[d.role] += sc.Incarnations(d)
		exits, kills := d.Exits()
		f.kills[d.role] += kills
		for _, e := range exits {
			switch {
			case e.Killed, e.Stopped:
			case e.Healthy:
				f.crashes[d.name] = append(f.crashes[d.name], e)
			default:
				f.startFailures[d.role]++
			}
		}
	}

	// Redeliveries, from the consumer: every delivery, redeliveries
	// included, takes a consumer sequence number.
	if nc, js, err := jetStreamAt(s.natsURL, "e2e-figures"); err == nil {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if c, err := js.Consumer(cctx, streamName, consumerName); err == nil {
			if ci, err := c.Info(cctx); err == nil {
				f.deliveries = ci.Delivered.Consumer
				if f.deliveries > f.createdMsgs {
					f.redeliveries = f.deliveries - f.createdMsgs
				}
			}
		}
		cancel()
		nc.Close()
	}
	f.durable = durableCounters(ctx, t, s.dbURL)

	switch ch := fr.(type) {
	case *chaos:
		ch.mu.Lock()
		f.outages = append([]time.Duration(nil), ch.outages...)
		f.backlogs = append([]int64(nil), ch.backlogs...)
		f.pgRestarts = ch.pgOK
		ch.mu.Unlock()
		f.relayMarkKills, f.workerAckKills = ch.Count(fRelayMark), ch.Count(fWorkerCommit)
	case *clusterChaos:
		f.cluster = ch.figures(ctx, s)
	}
	for _, px := range s.proxies {
		ps := px.Stats()
		f.proxy.requests += ps.Requests
		f.proxy.dropped += ps.Dropped
		f.proxy.upstreamErrors += ps.UpstreamErrors
	}
	return f
}

// durableCounters reads the database's own duplicate and replay counters
// (outbox_events.ack_duplicate…, inbox.duplicates, inbox.deliveries,
// operations.replays) when the schema has them: summed integers, counted
// booleans.
func durableCounters(ctx context.Context, t *testing.T, dbURL string) map[string]int64 {
	out := map[string]int64{}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return out
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT table_name, column_name, data_type FROM information_schema.columns
		WHERE table_schema = current_schema() AND (
			(table_name = 'outbox_events' AND column_name LIKE '%dup%') OR
			(table_name = 'quill_consumer_inbox' AND (column_name LIKE '%dup%' OR column_name LIKE '%deliver%')) OR
			(table_name = 'operations' AND column_name LIKE '%replay%'))`)
	if err != nil {
		return out
	}
	type col struct{ table, column, typ string }
	var cols []col
	for rows.Next() {
		var c col
		if rows.Scan(&c.table, &c.column, &c.typ) == nil {
			cols = append(cols, c)
		}
	}
	rows.Close()
	for _, c := range cols {
		var sql string
		switch c.typ {
		case "boolean":
			sql = fmt.Sprintf(`SELECT count(*) FILTER (WHERE %s) FROM %s`, pgx.Identifier{c.column}.Sanitize(), pgx.Identifier{c.table}.Sanitize())
		case "integer", "bigint", "smallint", "numeric":
			sql = fmt.Sprintf(`SELECT coalesce(sum(%s), 0)::bigint FROM %s`, pgx.Identifier{c.column}.Sanitize(), pgx.Identifier{c.table}.Sanitize())
		default:
			continue
		}
		var n int64
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Logf("durable counter %s.%s: %v", c.table, c.column, err)
			continue
		}
		out[c.table+"."+c.column] = n
	}
	return out
}

// durableMatching sums the durable counters whose name contains every part.
func (f *figures) durableMatching(parts ...string) (int64, bool) {
	var n int64
	found := false
	for k, v := range f.durable {
		all := true
		for _, p := range parts {
			if !strings.Contains(k, p) {
				all = false
			}
		}
		if all {
			n += v
			found = true
		}
	}
	return n, found
}

// proveFaults fails the test unless every fault fired and left its trace:
// kills, NATS outages with a backlog, PostgreSQL restarts, dropped
// responses, duplicate acknowledgements, inbox duplicates, redeliveries and
// replays; and no program crashed or panicked.
func (s *system) proveFaults(t *testing.T, p profile, ch *chaos, f *figures) {
	t.Helper()
	want := map[string]int{s.api.role: p.KillsEach, s.relay.role: p.KillsEach + p.TargetedEach, s.worker.role: p.KillsEach + p.TargetedEach}
	for role, n := range want {
		if f.kills[role] < n {
			t.Errorf("FAULT not fired: %s was SIGKILLed %d times, want at least %d", role, f.kills[role], n)
		}
	}
	s.proveNoCrash(t, f)
	if len(f.outages) < p.NATSOutages {
		t.Errorf("FAULT not fired: NATS was down %d times, want %d", len(f.outages), p.NATSOutages)
	}
	for i, o := range f.outages {
		if o < p.NATSOutage {
			t.Errorf("FAULT too short: NATS outage %d lasted %s, want %s", i+1, o, p.NATSOutage)
		}
		if f.backlogs[i] <= 0 {
			t.Errorf("FAULT without effect: no event waited in the outbox during NATS outage %d", i+1)
		}
	}
	if f.pgRestarts < p.PGRestarts {
		t.Errorf("FAULT not fired: PostgreSQL restarted %d times (postmaster start time changed), want %d", f.pgRestarts, p.PGRestarts)
	}
	if f.relayMarkKills < p.TargetedEach {
		t.Errorf("FAULT not fired: the relay was killed between publish and mark %d times, want %d", f.relayMarkKills, p.TargetedEach)
	}
	if f.workerAckKills < p.TargetedEach {
		t.Errorf("FAULT not fired: the worker was killed between commit and ack %d times, want %d", f.workerAckKills, p.TargetedEach)
	}
	s.proveResends(t, f)
	dupAcks := int64(f.relayDuplicates)
	if n, ok := f.durableMatching("outbox_events", "dup"); ok {
		dupAcks = max(dupAcks, n)
	}
	if dupAcks == 0 {
		t.Errorf("FAULT not proven: no duplicate PubAck reached the relay (quill_relay_duplicates_total = 0)")
	}
	inboxDups := int64(f.workerDuplicate)
	if n, ok := f.durableMatching("inbox", "dup"); ok {
		inboxDups = max(inboxDups, n)
	}
	if inboxDups == 0 {
		t.Errorf("FAULT not proven: the inbox recognised no duplicate (quill_worker_messages_total{result=\"duplicate\"} = 0)")
	}
	if f.redeliveries == 0 {
		t.Errorf("FAULT not proven: the consumer redelivered nothing (%d deliveries for %d note.created messages)", f.deliveries, f.createdMsgs)
	}
}

// proveNoCrash fails t for every daemon that exited on its own after it
// was up, and for a panic, fatal error or data race in any log.
func (s *system) proveNoCrash(t *testing.T, f *figures) {
	t.Helper()
	for _, d := range s.daemons() {
		for _, e := range f.crashes[d.name] {
			t.Errorf("PRODUCT: %s incarnation %d exited on its own after it was up (%s, after %s): a running daemon must retry, not exit (see %s)",
				d.name, e.Incarnation, e.Status, e.Uptime.Round(time.Millisecond), d.logFile)
		}
		if bad := grepFile(d.logFile, 5, "panic:", "fatal error:", "DATA RACE"); len(bad) > 0 {
			t.Errorf("PRODUCT: %s log shows a panic or fatal error:\n%s", d.name, strings.Join(bad, "\n"))
		}
	}
}

// proveResends fails t unless responses were dropped and the API replayed
// resends.
func (s *system) proveResends(t *testing.T, f *figures) {
	t.Helper()
	if f.proxy.dropped == 0 || f.transport == 0 {
		t.Errorf("FAULT not fired: the proxy dropped %d responses, clients saw %d transport errors", f.proxy.dropped, f.transport)
	}
	replays := int64(f.apiReplayed)
	if n, ok := f.durableMatching("operations", "replay"); ok {
		replays = max(replays, n)
	}
	if replays == 0 {
		t.Errorf("FAULT not proven: the API replayed nothing (quill_idempotency_requests_total{outcome=\"replayed\"} = 0)")
	}
}

// String renders the figures as the run's report.
// inKeyOrder formats each entry of m with format (its key, then its
// value), in the order of the keys.
func inKeyOrder[K cmp.Ordered, V any](m map[K]V, format string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, fmt.Sprintf(format, k, m[k]))
	}
	return out
}

func (f *figures) String() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p := f.profile
	w("=== Quill fault suite, profile %s", p.Name)
	w("duration        %.1fs (load %.1fs, drain %.1fs)", f.duration.Seconds(), f.load.Seconds(), f.drain.Seconds())
	w("operations      %d (%d creates, %d updates, %d deletes); %d resent 2–5× under their key (%d of them concurrently)", f.ops, f.creates, f.updates, f.deletes, f.resent, f.resentAtOnce)
	e := f.tally.Edits
	w("updates         %d made a version, %d changed nothing, %d refused 412, %d found no note (404); %d races of two agents from one version (%d hit by the faults); %d new intents after a 412; %d notes edited, up to version %d; %d reads of a note",
		e.Accepted, e.Unchanged, e.Refused, e.Gone, e.Races, e.FaultedRaces, e.After412, e.EditedNotes, e.MaxVersion, f.reads)
	cs := inKeyOrder(f.statuses, "%[2]d×%[1]d") // count×status
	w("requests        %d sent by clients (%d lost: transport errors; answers %s); proxy %d, %d responses dropped, %d upstream errors; API counted %.0f",
		f.requests, f.transport, strings.Join(cs, " "), f.proxy.requests, f.proxy.dropped, f.proxy.upstreamErrors, f.apiHTTP)
	w("outcomes        %d decided for the client; %d unknown to it and executed; %d unknown and never executed; %d unresolved",
		f.tally.Decided, f.tally.UnknownExecuted, f.tally.UnknownNotExecuted, f.tally.Unresolved)
	w("effects         %d notes (%d deleted); attachments %d processed, %d skipped (note deleted first); %d events, %d stream messages",
		f.notes, f.deleted, f.attProcessed, f.attSkipped, f.events, f.streamMsgs)
	w("api             executed %.0f, replayed %.0f, in progress (409) %.0f, key reused %.0f; business effects create %.0f, update %.0f, delete %.0f",
		f.apiExecuted, f.apiReplayed, f.apiInProgress, f.apiKeyReused, f.effectsCreate, f.effectsUpdate, f.effectsDelete)
	w("suppressed      api: %.0f replays; relay→JetStream: %.0f duplicate acks of %.0f publishes (%.0f publish errors); worker inbox: %.0f duplicates",
		f.apiReplayed, f.relayDuplicates, f.relayPublished, f.relayErrors, f.workerDuplicate)
	w("worker          processed %.0f, duplicate %.0f, skipped %.0f, failed %.0f, dead-lettered %.0f; consumer deliveries %d for %d note.created (%d redeliveries)",
		f.workerProcessed, f.workerDuplicate, f.workerSkipped, f.workerFailed, f.workerDead, f.deliveries, f.createdMsgs, f.redeliveries)
	if len(f.durable) > 0 {
		w("durable         %s", strings.Join(inKeyOrder(f.durable, "%s=%d"), ", "))
	} else {
		w("durable         (no durable duplicate/replay counters in this schema yet)")
	}
	var outs []string
	for i, o := range f.outages {
		outs = append(outs, fmt.Sprintf("%.1fs with %d events waiting", o.Seconds(), f.backlogs[i]))
	}
	if f.cluster != nil {
		f.cluster.write(w)
		var rs []string
		for _, n := range f.relayNames {
			rs = append(rs, fmt.Sprintf("%s %.0f errors, %.0f duplicate acks", n, f.relayErrorsBy[n], f.relayDuplicatesBy[n]))
		}
		w("relays          publish errors %.0f, retried until every event was in the stream once (%s)", f.relayErrors, strings.Join(rs, "; "))
	} else {
		w("faults          SIGKILL api %d, relay %d (%d between publish and mark), worker %d (%d between commit and ack); NATS down %s; PostgreSQL restarts %d",
			f.kills["api"], f.kills["relay"], f.relayMarkKills, f.kills["attachment-worker"], f.workerAckKills, strings.Join(outs, ", "), f.pgRestarts)
	}
	w("processes       %d api, %d relay, %d worker; incarnations scraped api %d, relay %d, worker %d; start-up failures (dependency down) api %d, relay %d, worker %d; crashes %d",
		f.daemons["api"], f.daemons["relay"], f.daemons["attachment-worker"], f.incarnations["api"], f.incarnations["relay"], f.incarnations["attachment-worker"],
		f.startFailures["api"], f.startFailures["relay"], f.startFailures["attachment-worker"],
		f.crashCount())
	return b.String()
}

// crashCount is how many incarnations of any daemon exited on their own
// after they were up.
func (f *figures) crashCount() int {
	n := 0
	for _, es := range f.crashes {
		n += len(es)
	}
	return n
}
