package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func ms(v ...int) []time.Duration {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x) * time.Millisecond
	}
	return d
}

// TestSummarize: nearest-rank percentiles over every operation, and
// operations/s over the measured window.
func TestSummarize(t *testing.T) {
	t.Parallel()
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[100-1-i] = i + 1 // 100 … 1: summarize sorts
	}
	for _, tc := range []struct {
		name          string
		p             legitPhase
		ops, p50, p99 float64
	}{
		{"empty", legitPhase{}, 0, 0, 0},
		{"one", legitPhase{Lat: ms(7), Done: 1, WindowS: 2}, 0.5, 7, 7},
		{"1..100, reversed", legitPhase{Lat: ms(hundred...), Done: 100, WindowS: 10}, 10, 50, 99},
		{"operations/s not rounded", legitPhase{Lat: ms(1, 2, 3), Done: 3, WindowS: 7}, 3.0 / 7, 2, 3},
		{"one slow of ten is the p99", legitPhase{Lat: ms(1, 1, 1, 1, 1, 1, 1, 1, 1, 900), Done: 10, WindowS: 1}, 10, 1, 900},
		{"failed operations count in latency, not in throughput", legitPhase{Lat: ms(5, 5, 5000), Done: 2, WindowS: 4}, 0.5, 5, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := summarize(tc.p)
			require.Equal(t, tc.ops, s.OpsPerSec)
			require.Equal(t, tc.p50, s.P50)
			require.Equal(t, tc.p99, s.P99)
		})
	}
}

func TestFormatCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    counts
		want string
	}{
		{nil, "none"},
		{counts{"http_429": 0}, "none"},
		{counts{"http_429": 3, "2xx": 10, "transport": 1}, "2xx=10 http_429=3 transport=1"},
		{counts{"": 2}, `""=2`},
	} {
		require.Equal(t, tc.want, formatCounts(tc.c))
	}
}

func TestStatusKiB(t *testing.T) {
	t.Parallel()
	status := "Name:\tapi\nVmPeak:\t  900 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\n"
	for _, tc := range []struct {
		name, status, field string
		want                int64
		wantErr             bool
	}{
		{"VmHWM", status, "VmHWM", 51234, false},
		{"VmRSS", status, "VmRSS", 40000, false},
		{"a prefix is not the field", status, "VmH", 0, true},
		{"missing", "Name:\tx\n", "VmHWM", 0, true},
		{"no unit", "VmHWM:\t12\n", "VmHWM", 0, true},
		{"not a number", "VmHWM:\tlots kB\n", "VmHWM", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := statusKiB([]byte(tc.status), tc.field)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a         answer
		kind      string
		retryable bool
		pause     time.Duration
	}{
		{answer{status: 201}, "2xx", false, retryMin},
		{answer{status: 429, retryAfter: time.Second}, "http_429", true, time.Second},
		{answer{status: 503, retryAfter: time.Hour}, "http_503", true, retryMax},
		{answer{status: 409}, "http_409", true, retryMin},
		{answer{status: 422}, "http_422", false, retryMin},
		{answer{status: 401}, "http_401", false, retryMin},
		{answer{err: errTest}, "transport", true, retryMin},
	} {
		require.Equal(t, tc.kind, tc.a.kind())
		require.Equal(t, tc.retryable, tc.a.retryable(), tc.kind)
		require.Equal(t, tc.pause, tc.a.pause(), tc.kind)
	}
	for in, want := range map[string]time.Duration{"3": 3 * time.Second, " 1 ": time.Second, "": 0, "-1": 0,
		"Wed, 21 Oct 2015 07:28:00 GMT": 0} {
		require.Equal(t, want, parseRetryAfter(in), in)
	}
}

type testErr struct{}

func (testErr) Error() string { return "connection reset" }

var errTest = testErr{}

// TestCheck: the integrity check counts each way an operation can go wrong
// once, and nothing when every key has its one note.
func TestCheck(t *testing.T) {
	t.Parallel()
	op := func(key, id string) *legitOp { return &legitOp{key: key, acked: id != "", noteID: id} }
	for _, tc := range []struct {
		name  string
		ops   [][]*legitOp
		found keyNotes
		want  integrity
	}{
		{"all well", [][]*legitOp{{op("a", "1"), op("b", "2")}, {op("c", "3")}},
			keyNotes{"a": {"1"}, "b": {"2"}, "c": {"3"}}, integrity{Keys: 3, Acked: 3}},
		{"a 2xx whose note is missing is lost", [][]*legitOp{{op("a", "1"), op("b", "2")}},
			keyNotes{"a": {"1"}}, integrity{Keys: 2, Acked: 2, Lost: 1}},
		{"a 2xx naming another note than the key's is lost", [][]*legitOp{{op("a", "1")}},
			keyNotes{"a": {"9"}}, integrity{Keys: 1, Acked: 1, Lost: 1}},
		{"two notes for a key is a duplicate", [][]*legitOp{{op("a", "1")}},
			keyNotes{"a": {"1", "2"}}, integrity{Keys: 1, Acked: 1, Duplicated: 1}},
		{"never answered, no note: unresolved, not lost", [][]*legitOp{{op("a", "")}},
			keyNotes{}, integrity{Keys: 1, Unresolved: 1}},
		{"never answered, two notes: unresolved and duplicated", [][]*legitOp{{op("a", "")}},
			keyNotes{"a": {"1", "2"}}, integrity{Keys: 1, Unresolved: 1, Duplicated: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, check(tc.ops, tc.found, 0))
		})
	}
}

// goodReport is a run that meets every target.
func goodReport() *report {
	c := config{legitClients: 16, resendShare: 0.2, attachShare: 0.5, warmup: time.Second, duration: 10 * time.Second,
		slowloris: 200, badTokenRate: 500, tenantConcurrency: 32, floodFactor: 10, bombRate: 1,
		decodeBudget: defaultDecodeBudget, legitTenants: []string{"legit"}, floodTenant: "flood", bombTenant: "bomber", drain: time.Second}
	quiet := legitPhase{Lat: ms(10, 10, 10, 10, 20), Done: 5, Creates: 4, Resends: 1, WindowS: 1, Requests: counts{"2xx": 5}}
	hostile := legitPhase{Lat: ms(12, 12, 12, 12, 40), Done: 4, Creates: 3, Resends: 1, WindowS: 1, Requests: counts{"2xx": 4}}
	okPeak := func(kib int64) peak { return peak{KiB: kib, Reset: true} }
	return &report{
		cfg:     c,
		quiet:   phaseResult{legit: quiet, api: okPeak(40 << 10), worker: okPeak(80 << 10)},
		hostile: phaseResult{legit: hostile, api: okPeak(200 << 10), worker: okPeak(300 << 10)},
		attack: attackReport{BombBytes: 327781,
			Loris:     &lorisStats{Conns: 250, Closed: 50, OpenAtEnd: 200, Lifetimes: ms(1000, 30000), Answers: counts{"http_408": 50}},
			BadTokens: &rateStats{Sent: 5000, Answers: counts{"http_401": 4000, "http_429": 1000}},
			Flood:     &floodStats{Requests: 1000, Answers: counts{"2xx": 100, "http_429": 900}},
			Bombs:     &rateStats{Sent: 10, Answers: counts{"2xx": 10}}},
		integrity: integrity{Keys: 7, Acked: 7},
		attach:    states{byStatus: counts{"processed": 3}},
		bombOutcome: states{byStatus: counts{"failed": 10},
			reasons: counts{"image too large": 10}},
	}
}

// TestReportTargets: each target is judged at its bound, and the last line
// counts the misses.
func TestReportTargets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*report)
		missed int
		want   []string
	}{
		{"all met", func(*report) {}, 0, []string{
			"legit operations/s (2xx)           |                    5 |                    4 |     0.8 | h ÷ q ≥ 0.8: met",
			"legit p99 ms                       |                   20 |                   40 |       2 | h ÷ q ≤ 2: met",
			"hostile < 256: met", "hostile < 384 (budget 256 + 128): met",
			"answered 429: 90.0 %", "reasons of the failures: image too large=10",
			"slowloris: 250 connections opened for 200 places; 50 closed by the server (lifetime median 1s, max 30s; answers http_408=50)",
			"targets missed: 0 of 9"}},
		{"throughput just under 0.8", func(r *report) { r.hostile.legit.WindowS = 1.001 }, 1, []string{"|                    4 |   0.799 | h ÷ q ≥ 0.8: MISSED"}},
		{"p99 just over 2×", func(r *report) { r.hostile.legit.Lat = ms(12, 12, 12, 12, 41) }, 1, []string{"2.05 | h ÷ q ≤ 2: MISSED"}},
		{"a quiet phase without answers has no ratio", func(r *report) { r.quiet.legit = legitPhase{} }, 2, []string{"n/a | h ÷ q ≥ 0.8: MISSED", "n/a | h ÷ q ≤ 2: MISSED"}},
		{"API at 256 MiB", func(r *report) { r.hostile.api.KiB = 256 << 10 }, 1, []string{"hostile < 256: MISSED"}},
		{"worker exited", func(r *report) { r.hostile.worker.Exited = true }, 1, []string{"300.0 (exited)", "the worker EXITED during the hostile phase", "budget 256 + 128): MISSED"}},
		{"worker over budget + 128 MiB", func(r *report) { r.hostile.worker.KiB = 400 << 10 }, 1, []string{"budget 256 + 128): MISSED"}},
		{"peak not reset is marked", func(r *report) { r.quiet.api.Reset = false }, 0, []string{"40.0*", "* the kernel's peak mark could not be reset"}},
		{"lost, duplicated, unresolved", func(r *report) { r.integrity = integrity{Keys: 7, Acked: 6, Lost: 1, Duplicated: 1, Unresolved: 1} },
			3, []string{"that note not in PostgreSQL): 1 — target 0: MISSED", "more than one note): 1 — target 0: MISSED", "even resent afterwards: 1 — target 0: MISSED"}},
		{"a resend not replayed", func(r *report) { r.hostile.legit.NotReplayed = 1 }, 1, []string{"Idempotent-Replayed: true 1, naming another note 0 — target 0: MISSED"}},
		{"no attackers", func(r *report) {
			r.cfg.slowloris, r.cfg.badTokenRate, r.cfg.floodFactor, r.cfg.bombRate = 0, 0, 0, 0
			r.attack = attackReport{}
		}, 0, []string{"Hostile phase adds: nothing (every attacker is off)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := goodReport()
			tc.change(r)
			var b bytes.Buffer
			require.Equal(t, tc.missed, r.write(&b))
			for _, s := range tc.want {
				require.Contains(t, b.String(), s)
			}
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			require.True(t, strings.HasPrefix(lines[len(lines)-1], "targets missed: "), lines[len(lines)-1])
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	args := func(extra ...string) []string {
		return append([]string{"--token", "a", "--flood-token", "b", "--bomb-token", "c"}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for no error
	}{
		{"defaults", args(), ""},
		{"no tokens", nil, "--token"},
		{"bad url", args("--url", "ftp://x"), "--url"},
		{"share over 1", args("--resend-share", "1.5"), "--resend-share"},
		{"negative rate", args("--bomb-rate", "-1"), "--bomb-rate"},
		{"no clients", args("--legit-clients", "0"), "--legit-clients"},
		{"zero duration", args("--duration", "0s"), "--duration"},
		{"negative slowloris", args("--slowloris", "-3"), "--slowloris"},
		{"negative flood pause", args("--flood-pause", "-1ms"), "--flood-pause"},
		{"not a number", args("--flood-factor", "ten"), "flood-factor"},
		{"extra argument", args("now"), "unexpected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			_, err := parseConfig(tc.args, func(string) string { return "" }, &stderr)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}
