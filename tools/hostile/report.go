package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/quillhq/quill/internal/measure"
)

// Targets of the issue.
const (
	// maxP99Ratio: the legitimate p99 under attack at most this × quiet.
	maxP99Ratio = 2.0
	// minThroughputRatio: the legitimate operations/s under attack at
	// least this × quiet.
	minThroughputRatio = 0.8
	// maxAPIRSS is the API's peak RSS target.
	maxAPIRSS = 256 << 20
	// workerRSSMargin is what the worker may take over its decode budget.
	workerRSSMargin = 128 << 20
	mib             = 1 << 20
)

// report is everything one run measured.
type report struct {
	cfg            config
	quiet, hostile phaseResult
	attack         attackReport
	recovered      int
	quietDrain     drained
	hostileDrain   drained
	attach         states
	integrity      integrity
	bombOutcome    states
}

// summary is a phase's headline: operations/s (not rounded, so that a
// ratio of two is exact) and latency percentiles.
type summary struct {
	OpsPerSec float64
	measure.Dist
}

// summarize sorts p.Lat in place and returns the phase's headline.
func summarize(p legitPhase) summary {
	s := summary{Dist: measure.Summarize(p.Lat)}
	if p.WindowS > 0 {
		s.OpsPerSec = float64(p.Done) / p.WindowS
	}
	return s
}

// ratio is a ÷ b, and false when b is not positive.
func ratio(a, b float64) (float64, bool) {
	if b <= 0 {
		return 0, false
	}
	return a / b, true
}

// verdicts counts the targets as they are judged.
type verdicts struct{ missed, met int }

func (v *verdicts) judge(ok bool) string {
	if ok {
		v.met++
		return "met"
	}
	v.missed++
	return "MISSED"
}

// formatCounts prints a tally as "a=1 b=2", sorted by name; "none" when empty.
func formatCounts(c counts) string {
	keys := make([]string, 0, len(c))
	for k, n := range c {
		if n > 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "none"
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		name := k
		if name == "" {
			name = `""`
		}
		parts[i] = name + "=" + strconv.Itoa(c[k])
	}
	return strings.Join(parts, " ")
}

func fmtMiB(kib int64) string { return strconv.FormatFloat(float64(kib)/1024, 'f', 1, 64) }

// peakCell is a peak for the table: MiB, "exited" marks, "-" when unknown.
func peakCell(p peak) string {
	switch {
	case p.KiB == 0:
		return "-"
	case p.Exited:
		return fmtMiB(p.KiB) + " (exited)"
	case !p.Reset:
		return fmtMiB(p.KiB) + "*"
	}
	return fmtMiB(p.KiB)
}

// tenantsPhrase is "tenant a" or "3 tenants (a, b, c)".
func tenantsPhrase(ts []string) string {
	if len(ts) == 1 {
		return "tenant " + ts[0]
	}
	return fmt.Sprintf("%d tenants (%s)", len(ts), strings.Join(ts, ", "))
}

// cpuOrder is the order of the CPU table's rows; other names follow.
var cpuOrder = []string{"api", postgresComm, "nats", "relay", "worker", "tool (legitimate clients)", "attackers"}

// writeCPU prints the cores each process used over each phase's measured
// window: where the machine's CPU went, and what the attack took of it.
func (r *report) writeCPU(w io.Writer) {
	q, h := r.quiet.cpu, r.hostile.cpu
	if len(q) == 0 && len(h) == 0 {
		return
	}
	names := slices.Clone(cpuOrder)
	for _, u := range []cpuUse{q, h} {
		for n := range u {
			if !slices.Contains(names, n) && n != machineRow {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names[len(cpuOrder):])
	cell := func(u cpuUse, n string) string {
		v, ok := u[n]
		if !ok {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	fmt.Fprintln(w, "CPU, cores used over the measured window (utime+stime from /proc; postgres: all its processes):")
	for _, n := range append(names, machineRow) {
		if _, qok := q[n]; !qok {
			if _, hok := h[n]; !hok {
				continue
			}
		}
		label := n
		if n == machineRow {
			label = "machine (all processes, /proc/stat)"
		}
		fmt.Fprintf(w, "  %-36s quiet %5s   hostile %5s\n", label, cell(q, n), cell(h, n))
	}
}

func pct(a, b int) string {
	if b == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*float64(a)/float64(b), 'f', 1, 64) + " %"
}

// write prints the report and returns the number of targets missed; its
// last line is "targets missed: N of M".
func (r *report) write(w io.Writer) int {
	var v verdicts
	c := r.cfg
	q, h := summarize(r.quiet.legit), summarize(r.hostile.legit)
	think := "no pause between requests"
	if c.legitThink > 0 {
		think = c.legitThink.String() + " of think time after each answer"
	}
	fmt.Fprintf(w, "Legitimate workload: %d clients in %s, one request at a time each, %s; %.0f %% of operations resend an earlier create (same key, same body), %.0f %% of creates carry a 64 KiB PNG; per phase %s warmup + %s measured\n",
		c.legitClients, tenantsPhrase(c.legitTenants), think, 100*c.resendShare, 100*c.attachShare, c.warmup, c.duration)
	var adds []string
	if c.slowloris > 0 {
		adds = append(adds, fmt.Sprintf("%d slowloris connections (Content-Length: %d, no token, no body)", c.slowloris, slowlorisLength))
	}
	if c.badTokenRate > 0 {
		adds = append(adds, fmt.Sprintf("%g requests/s with random well-formed tokens", c.badTokenRate))
	}
	if c.floodFactor > 0 {
		adds = append(adds, fmt.Sprintf("tenant %s creating at %d concurrent (%d × QUILL_TENANT_CONCURRENCY %d; %s pause after a non-2xx)",
			c.floodTenant, c.floodFactor*c.tenantConcurrency, c.floodFactor, c.tenantConcurrency, c.floodPause))
	}
	if c.bombRate > 0 {
		adds = append(adds, fmt.Sprintf("image bombs at %g/s from tenant %s (%d×%d 16-bit RGBA PNG of %d bytes, decoding to %.0f MiB)",
			c.bombRate, c.bombTenant, bombSide, bombSide, r.attack.BombBytes, float64(decodedBytes(bombSide, bombSide))/mib))
	}
	if c.inventedRate > 0 {
		adds = append(adds, fmt.Sprintf("%g requests/s with a fresh invented method each (one in %d %d KiB long) and no token, half to %s, half to unmatched paths",
			c.inventedRate, inventedLongEvery, inventedLongBytes>>10, notesPath))
	}
	if c.idleConns > 0 {
		to := "the API"
		if c.adminURL != "" {
			to = "the API and to its admin server"
		}
		adds = append(adds, fmt.Sprintf("one host holding %d idle connections to %s each (half after one request, half sending nothing; reopened %s after the server closes one)",
			c.idleConns, to, idleRedialPause))
	}
	if len(adds) == 0 {
		adds = []string{"nothing (every attacker is off)"}
	}
	fmt.Fprintf(w, "Hostile phase adds: %s\n", strings.Join(adds, "; "))
	if c.noteAPI != "" {
		fmt.Fprintf(w, "API: %s\n", c.noteAPI)
	}
	if c.noteWorker != "" {
		fmt.Fprintf(w, "Worker: %s\n", c.noteWorker)
	}
	if c.noteAttack != "" {
		fmt.Fprintf(w, "Attackers: %s\n", c.noteAttack)
	}
	fmt.Fprintf(w, "Sources: %s\n", sourcesLine(c.ownAddrs))
	fmt.Fprintln(w)

	row := func(name, quiet, hostile, rat, target string) {
		fmt.Fprintf(w, "%-34s | %20s | %20s | %7s | %s\n", name, quiet, hostile, rat, target)
	}
	ff := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
	ratioCell := func(a, b float64) (string, float64, bool) {
		x, ok := ratio(a, b)
		if !ok {
			return "n/a", 0, false
		}
		return ff(measure.Round(x, 3)), x, true
	}
	row("", "quiet", "hostile", "h ÷ q", "target")
	fmt.Fprintln(w, strings.Repeat("-", 35)+"+"+strings.Repeat("-", 22)+"+"+strings.Repeat("-", 22)+"+"+strings.Repeat("-", 9)+"+"+strings.Repeat("-", 30))
	cell, x, ok := ratioCell(h.OpsPerSec, q.OpsPerSec)
	row("legit operations/s (2xx)", ff(measure.Round(q.OpsPerSec, 1)), ff(measure.Round(h.OpsPerSec, 1)), cell,
		fmt.Sprintf("h ÷ q ≥ %g: %s", minThroughputRatio, v.judge(ok && x >= minThroughputRatio)))
	cell, _, _ = ratioCell(h.P50, q.P50)
	row("legit p50 ms", ff(q.P50), ff(h.P50), cell, "")
	cell, x, ok = ratioCell(h.P99, q.P99)
	row("legit p99 ms", ff(q.P99), ff(h.P99), cell,
		fmt.Sprintf("h ÷ q ≤ %g: %s", maxP99Ratio, v.judge(ok && x <= maxP99Ratio)))
	row("legit p99.9 / max ms", ff(q.P999)+" / "+ff(q.Max), ff(h.P999)+" / "+ff(h.Max), "", "")
	ql, hl := r.quiet.legit, r.hostile.legit
	row("operations measured (cre/res)", fmt.Sprintf("%d/%d", ql.Creates, ql.Resends), fmt.Sprintf("%d/%d", hl.Creates, hl.Resends), "", "")
	row("given up at phase end / rejected", fmt.Sprintf("%d / %d", ql.Failed, ql.Rejected), fmt.Sprintf("%d / %d", hl.Failed, hl.Rejected), "", "given up: resent after the phases")
	row("attachments pending after drain", fmt.Sprintf("%d (%gs)", r.quietDrain.Pending, r.quietDrain.WaitedS),
		fmt.Sprintf("%d (%gs)", r.hostileDrain.Pending, r.hostileDrain.WaitedS), "", fmt.Sprintf("every tenant's; waited at most %s", c.drain))
	row("API peak RSS MiB", peakCell(r.quiet.api), peakCell(r.hostile.api), "",
		fmt.Sprintf("hostile < %d: %s", maxAPIRSS/mib, v.judge(r.hostile.api.KiB > 0 && !r.hostile.api.Exited && r.hostile.api.KiB*1024 < maxAPIRSS)))
	workerMax := c.decodeBudget + workerRSSMargin
	row("worker peak RSS MiB", peakCell(r.quiet.worker), peakCell(r.hostile.worker), "",
		fmt.Sprintf("hostile < %.0f (budget %.0f + %d): %s", float64(workerMax)/mib, float64(c.decodeBudget)/mib, workerRSSMargin/mib,
			v.judge(r.hostile.worker.KiB > 0 && !r.hostile.worker.Exited && r.hostile.worker.KiB*1024 < workerMax)))
	if c.adminURL != "" {
		qp99, qmax := probeSummary(r.quiet.probe)
		hp99, hmax := probeSummary(r.hostile.probe)
		row("admin /healthz p99 / max ms", ff(qp99)+" / "+ff(qmax), ff(hp99)+" / "+ff(hmax), "",
			fmt.Sprintf("hostile: each 2xx < %s: %s", probeTimeout, v.judge(r.hostile.probe.ok())))
	}
	fmt.Fprintf(w, "legit requests by answer: quiet %s; hostile %s\n", formatCounts(ql.Requests), formatCounts(hl.Requests))
	if c.adminURL != "" {
		fmt.Fprintf(w, "health probes (GET /healthz on the admin address, a new connection every %s, whole phase) by answer: quiet %s; hostile %s\n",
			probeEvery, formatCounts(r.quiet.probe.Answers), formatCounts(r.hostile.probe.Answers))
	}
	fmt.Fprintln(w, "peak RSS: the highest VmHWM over the phase and the drain after it (the kernel's mark, reset at the phase's start)")
	r.writeCPU(w)
	unreset := func(p peak) bool { return p.KiB > 0 && !p.Reset }
	if unreset(r.quiet.api) || unreset(r.hostile.api) || unreset(r.quiet.worker) || unreset(r.hostile.worker) {
		fmt.Fprintln(w, "* the kernel's peak mark could not be reset (clear_refs): the peak since the process started")
	}
	for _, p := range []struct {
		name string
		p    peak
	}{{"API", r.hostile.api}, {"worker", r.hostile.worker}} {
		if p.p.Exited {
			fmt.Fprintf(w, "the %s EXITED during the hostile phase (last peak read: %s MiB)\n", p.name, fmtMiB(p.p.KiB))
		} else if p.p.Err != "" {
			fmt.Fprintf(w, "the %s's peak could not be read: %s\n", p.name, p.p.Err)
		}
	}
	fmt.Fprintln(w)
	r.writeSeries(w, &v)

	in := r.integrity
	fmt.Fprintf(w, "Lost and duplicated operations (PostgreSQL, both phases, after resending the %d creates given up at a phase end: %d answered then):\n",
		ql.Failed+hl.Failed, r.recovered)
	fmt.Fprintf(w, "  legitimate keys %d, answered 2xx %d\n", in.Keys, in.Acked)
	fmt.Fprintf(w, "  lost (answered 2xx, that note not in PostgreSQL): %d — target 0: %s\n", in.Lost, v.judge(in.Lost == 0))
	fmt.Fprintf(w, "  duplicated (a key with more than one note): %d — target 0: %s\n", in.Duplicated, v.judge(in.Duplicated == 0))
	fmt.Fprintf(w, "  never answered 2xx, even resent afterwards: %d — target 0: %s\n", in.Unresolved, v.judge(in.Unresolved == 0))
	bad := ql.NotReplayed + hl.NotReplayed + ql.OtherNote + hl.OtherNote
	fmt.Fprintf(w, "  resends answered 2xx without Idempotent-Replayed: true %d, naming another note %d — target 0: %s\n",
		ql.NotReplayed+hl.NotReplayed, ql.OtherNote+hl.OtherNote, v.judge(bad == 0))
	fmt.Fprintf(w, "  rejected (a 4xx no retry fixes): %d — target 0: %s\n", ql.Rejected+hl.Rejected, v.judge(ql.Rejected+hl.Rejected == 0))
	if in.Strays > 0 {
		fmt.Fprintf(w, "  notes of %s that no key of this run made: %d\n", tenantsPhrase(c.legitTenants), in.Strays)
	}
	fmt.Fprintf(w, "  legitimate attachments at the end: %s\n", formatCounts(r.attach.byStatus))
	if len(r.attach.reasons) > 0 {
		fmt.Fprintf(w, "    reasons of the failures: %s\n", formatCounts(r.attach.reasons))
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "Attackers (hostile phase):")
	if l := r.attack.Loris; l != nil {
		p50, mx := lifetimeSummary(l.Lifetimes)
		fmt.Fprintf(w, "  slowloris: %d connections opened for %d places; %d closed by the server (lifetime median %gs, max %gs; answers %s); %d still open at the end; %d dials failed\n",
			l.Conns, c.slowloris, l.Closed, p50, mx, formatCounts(l.Answers), l.OpenAtEnd, l.DialErrs)
	}
	if b := r.attack.BadTokens; b != nil {
		fmt.Fprintf(w, "  bad tokens: %d sent (%g/s asked), %d slots skipped (all %d in flight); answers %s\n",
			b.Sent, c.badTokenRate, b.Skipped, badTokenInFlight, formatCounts(b.Answers))
	}
	if f := r.attack.Flood; f != nil {
		fmt.Fprintf(w, "  flood (tenant %s, %d concurrent): %d requests, answered 429: %s; answers %s\n",
			c.floodTenant, c.floodFactor*c.tenantConcurrency, f.Requests, pct(f.Answers["http_429"], f.Requests), formatCounts(f.Answers))
	}
	if b := r.attack.Bombs; b != nil {
		fmt.Fprintf(w, "  bombs: %d sent (%g/s asked), %d slots skipped; answers %s\n", b.Sent, c.bombRate, b.Skipped, formatCounts(b.Answers))
		fmt.Fprintf(w, "    the bombs' attachments at the end: %s", formatCounts(r.bombOutcome.byStatus))
		if len(r.bombOutcome.reasons) > 0 {
			fmt.Fprintf(w, "; reasons of the failures: %s", formatCounts(r.bombOutcome.reasons))
		}
		fmt.Fprintln(w)
	}
	if m := r.attack.Invented; m != nil {
		fmt.Fprintf(w, "  invented methods: %d sent (%g/s asked), %d slots skipped (all %d in flight); answers %s\n",
			m.Sent, c.inventedRate, m.Skipped, inventedInFlight, formatCounts(m.Answers))
	}
	for _, st := range r.attack.Idle {
		fmt.Fprintf(w, "  idle host → %s: %d places, %d connections opened, at most %d open at once as the host saw them (the server's accept queue included); %d refused with 503 (past its share), %d closed by the server otherwise; %d still open at the end; keep-alive requests answered %s; %d dials failed\n",
			st.Target, st.Places, st.Opened, st.MaxOpen, st.Refused, st.Closed, st.OpenAtEnd, formatCounts(st.Answers), st.DialErrs)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "targets missed: %d of %d\n", v.missed, v.missed+v.met)
	return v.missed
}

// maxAddedShown bounds the series listed as added: enough to see which
// labels they carry, not a page of them when something mints one per
// request.
const maxAddedShown = 8

// seriesLine is one scrape for the series block.
func seriesLine(s series) string {
	if s.Err != "" {
		return "not read: " + s.Err
	}
	line := fmt.Sprintf("%s %d, %s %d, method values %d (%s)", requestsMetric, s.Requests, durationMetric, s.Durations,
		len(s.methods), listAdded(s.Methods()))
	if s.RSSKiB > 0 {
		line += fmt.Sprintf("; API RSS %s MiB", fmtMiB(s.RSSKiB))
	}
	return line
}

// listAdded prints up to maxAddedShown of items and how many more.
func listAdded(items []string) string {
	n := min(len(items), maxAddedShown)
	out := strings.Join(items[:n], " ")
	if more := len(items) - n; more > 0 {
		out += fmt.Sprintf(" … and %d more", more)
	}
	return out
}

// writeSeries prints the API's HTTP series at each phase's measured
// window's start and end, judges them flat over the hostile window and
// the method values bounded, and names the series the hostile phase
// added to the quiet phase's (new status codes or routes of the attack's
// requests: a bounded set, seen in its first seconds).
func (r *report) writeSeries(w io.Writer, v *verdicts) {
	if r.cfg.adminURL == "" {
		fmt.Fprintln(w, "Series of the API's HTTP metrics: not measured (no --admin-url)")
		fmt.Fprintln(w)
		return
	}
	q, h := r.quiet, r.hostile
	fmt.Fprintln(w, "Series of the API's HTTP metrics (its admin /metrics, scraped at each measured window's start and end):")
	fmt.Fprintf(w, "  quiet start:   %s\n", seriesLine(q.start))
	fmt.Fprintf(w, "  quiet end:     %s\n", seriesLine(q.end))
	fmt.Fprintf(w, "  hostile start: %s\n", seriesLine(h.start))
	fmt.Fprintf(w, "  hostile end:   %s\n", seriesLine(h.end))
	sent := ""
	if m := r.attack.Invented; m != nil {
		sent = fmt.Sprintf(" while ~%d invented methods were sent", int(r.cfg.inventedRate*r.cfg.duration.Seconds()))
	}
	fmt.Fprintf(w, "  hostile window%s: %s — target flat (no method value and no _OTHER series added): %s\n",
		sent, flatPhrase(h.start, h.end), v.judge(flat(h.start, h.end)))
	if a := added(h.start, h.end); len(a) > 0 && h.start.Err == "" && h.end.Err == "" {
		fmt.Fprintf(w, "    added in the hostile window: %s\n", listAdded(a))
	}
	if q.start.RSSKiB > 0 && q.end.RSSKiB > 0 && h.start.RSSKiB > 0 && h.end.RSSKiB > 0 {
		delta := func(a, b series) string {
			return fmt.Sprintf("%s → %s MiB (%+.1f)", fmtMiB(a.RSSKiB), fmtMiB(b.RSSKiB), float64(b.RSSKiB-a.RSSKiB)/1024)
		}
		fmt.Fprintf(w, "  API RSS over the measured window (VmRSS at the scrapes): quiet %s, hostile %s\n", delta(q.start, q.end), delta(h.start, h.end))
	}
	bad := unbounded(h.end)
	verdict := v.judge(h.end.Err == "" && len(bad) == 0)
	switch {
	case h.end.Err != "":
		fmt.Fprintf(w, "  method values at the hostile end: not read — target each routed or _OTHER: %s\n", verdict)
	case len(bad) == 0:
		fmt.Fprintf(w, "  method values at the hostile end: each a method the SPEC allows or _OTHER — target: %s\n", verdict)
	default:
		fmt.Fprintf(w, "  method values at the hostile end: %d a caller invented (%s) — target none: %s\n", len(bad), listAdded(bad), verdict)
	}
	if a := added(q.end, h.start); len(a) > 0 && q.end.Err == "" && h.start.Err == "" {
		fmt.Fprintf(w, "  added by the attack's first seconds (quiet end → hostile start, %d): %s\n", len(a), listAdded(a))
	}
	fmt.Fprintln(w)
}

// flatPhrase compares two scrapes' counts: "flat (a, b, m)" or "a → a', ...".
func flatPhrase(a, b series) string {
	if a.Err != "" || b.Err != "" {
		return "not compared (a scrape failed)"
	}
	if unchanged(a, b) {
		return fmt.Sprintf("unchanged (%d, %d series, %d method values)", b.Requests, b.Durations, len(b.methods))
	}
	return fmt.Sprintf("%s %d → %d, %s %d → %d, method values %d → %d", requestsMetric, a.Requests, b.Requests,
		durationMetric, a.Durations, b.Durations, len(a.methods), len(b.methods))
}
