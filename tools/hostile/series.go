package main

import (
	"bufio"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/wait"
)

// The metrics whose series an invented method used to mint (issue 24
// item 1), as the API's admin /metrics exposes them.
const (
	requestsMetric = "quill_http_requests_total"
	durationMetric = "quill_http_request_duration_seconds"
	// maxScrape is the most of a /metrics answer read: a few KiB when the
	// labels are bounded, hundreds of MiB when each request mints a 60 KiB
	// label value; it is read line by line and only hashes are kept.
	maxScrape = 2 << 30
	// scrapeTimeout bounds one scrape: rendering and reading the
	// hundreds of MiB of a server that mints labels takes seconds.
	scrapeTimeout = 60 * time.Second
	// probeTimeout is how long the health probe waits for an answer: the
	// issue's "served within 3 s" (a kubelet's probe gives up sooner).
	probeTimeout = 3 * time.Second
	// probeEvery is how often the health probe asks.
	probeEvery = 500 * time.Millisecond
)

// boundedMethods are the method label values the SPEC allows (§8: a routed
// method or _OTHER); the API routes a subset. An invented method that
// reached a label would be none of them.
var boundedMethods = []string{"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE", "_OTHER"}

// series is what one scrape said of the two metrics.
type series struct {
	// Requests counts quill_http_requests_total's series; Durations
	// quill_http_request_duration_seconds's (one per label set, the
	// buckets' le aside).
	Requests, Durations int
	// methods are the distinct method label values of both, keys both
	// metrics' series ("name{label=value,...}"), each by the FNV-64a hash
	// of its whole text, with long values cut for the report: an invented
	// method minted per request would otherwise be kept whole, 60 KiB a
	// series, by the tool too.
	methods, keys map[uint64]string
	// other holds the keys of the series whose method is _OTHER: the
	// series an invented method reaches.
	other map[uint64]bool
	// RSSKiB is the API's resident set (VmRSS) read with the scrape, 0
	// when not read.
	RSSKiB int64
	// Err says why the scrape failed ("" when it did not).
	Err string
}

// Methods are the distinct method values, long ones cut, sorted.
func (s series) Methods() []string { return sortedValues(s.methods) }

func sortedValues(m map[uint64]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

func hashOf(v string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(v))
	return h.Sum64()
}

// countSeries reads a Prometheus text exposition line by line and counts
// the two metrics' series; an error for a line it cannot parse or a read
// that fails.
func countSeries(in io.Reader) (series, error) {
	s := series{methods: map[uint64]string{}, keys: map[uint64]string{}, other: map[uint64]bool{}}
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		line, rerr := br.ReadString('\n')
		if err := s.addLine(strings.TrimSpace(line)); err != nil {
			return series{}, err
		}
		if rerr == io.EOF {
			return s, nil
		}
		if rerr != nil {
			return series{}, fmt.Errorf("read the metrics: %w", rerr)
		}
	}
}

// addLine counts one line of the exposition.
func (s *series) addLine(line string) error {
	if line == "" || line[0] == '#' {
		return nil
	}
	name, rest, _ := strings.Cut(line, "{")
	name = strings.TrimSpace(name)
	if i := strings.IndexAny(name, " \t"); i >= 0 {
		name, rest = name[:i], "" // no labels
	}
	var kind string
	switch name {
	case requestsMetric:
		kind, s.Requests = requestsMetric, s.Requests+1
	case durationMetric + "_count":
		kind, s.Durations = durationMetric, s.Durations+1
	default:
		return nil
	}
	labels, err := parseLabels(rest)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	key := hashOf(seriesKey(kind, labels, false))
	if m, ok := labels["method"]; ok {
		s.methods[hashOf(m)] = shortValue(m)
		if m == "_OTHER" {
			s.other[key] = true
		}
	}
	s.keys[key] = seriesKey(kind, labels, true)
	return nil
}

// parseLabels reads the labels of a sample line, from just after its "{"
// ("" for a sample without labels): name="value" pairs separated by
// commas up to "}", the values with \\, \" and \n escapes (a route
// pattern holds braces, so the closing one is found by parsing, not by
// searching).
func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	if s == "" {
		return labels, nil
	}
	for i := 0; ; {
		for i < len(s) && (s[i] == ',' || s[i] == ' ') {
			i++
		}
		if i < len(s) && s[i] == '}' {
			return labels, nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq <= 0 || i+eq+1 >= len(s) || s[i+eq+1] != '"' {
			return nil, fmt.Errorf("labels %q: a name=\"value\" pair expected at byte %d", s, i)
		}
		name := strings.TrimSpace(s[i : i+eq])
		i += eq + 2
		var v strings.Builder
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				if s[i] == 'n' {
					v.WriteByte('\n')
					continue
				}
			}
			v.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, fmt.Errorf("labels %q: value of %s not closed", s, name)
		}
		labels[name] = v.String()
		i++
	}
}

// seriesKey names a series by its metric and labels, le (a bucket's
// bound) aside, the labels sorted; short cuts each value past
// maxShownValue bytes to its start and length, for the report.
func seriesKey(metric string, labels map[string]string, short bool) string {
	names := make([]string, 0, len(labels))
	for n := range labels {
		if n != "le" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		v := labels[n]
		if short {
			v = shortValue(v)
		}
		parts[i] = n + "=" + strconv.Quote(v)
	}
	return metric + "{" + strings.Join(parts, ",") + "}"
}

// maxShownValue is the longest label value the report prints whole: an
// invented 60 KiB method is shown by its start and length.
const maxShownValue = 32

// shortValue is v, or its first 16 bytes and its length when longer than
// maxShownValue.
func shortValue(v string) string {
	if len(v) <= maxShownValue {
		return v
	}
	return fmt.Sprintf("%s…(%d bytes)", v[:16], len(v))
}

// flat says no series was minted by an invented method between the two
// scrapes: b has a's method values and no series with method _OTHER that a
// lacks. A series of a routed method can still appear (a legitimate
// request answered with a code new to the window, 503 from the pool's
// share say): routes × routed methods × codes bound those, and unchanged
// says whether any appeared.
func flat(a, b series) bool {
	if a.Err != "" || b.Err != "" || len(a.methods) != len(b.methods) || len(addedMethods(a, b)) > 0 {
		return false
	}
	for h := range b.other {
		if !a.other[h] {
			return false
		}
	}
	return true
}

// unchanged says b has exactly a's series.
func unchanged(a, b series) bool {
	return a.Err == "" && b.Err == "" && a.Requests == b.Requests && a.Durations == b.Durations && len(added(a, b)) == 0
}

// added are b's series that a lacks, long values cut, sorted.
func added(a, b series) []string { return missing(a.keys, b.keys) }

// addedMethods are b's method values that a lacks.
func addedMethods(a, b series) []string { return missing(a.methods, b.methods) }

func missing(a, b map[uint64]string) []string {
	out := map[uint64]string{}
	for h, v := range b {
		if _, ok := a[h]; !ok {
			out[h] = v
		}
	}
	return sortedValues(out)
}

// unbounded are the method values of s that the SPEC does not allow: a
// method a caller invented, kept as a label. A value cut for the report
// is longer than any allowed one, so the cut form decides as well.
func unbounded(s series) []string {
	var out []string
	for _, m := range s.Methods() {
		if !slices.Contains(boundedMethods, m) {
			out = append(out, m)
		}
	}
	return out
}

// scrape reads the API's admin /metrics and counts the series, with the
// API's VmRSS at that moment (pid 0: not read); a failure is in Err.
func scrape(ctx context.Context, hc *http.Client, adminURL string, pid int) series {
	s, err := scrapeSeries(ctx, hc, adminURL)
	if err != nil {
		s = series{Err: err.Error()}
	}
	if pid > 0 {
		s.RSSKiB = readKiB(pid, "VmRSS")
	}
	return s
}

func scrapeSeries(ctx context.Context, hc *http.Client, adminURL string) (series, error) {
	u := strings.TrimRight(adminURL, "/") + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return series{}, fmt.Errorf("scrape %s: %w", u, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return series{}, fmt.Errorf("scrape %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return series{}, fmt.Errorf("scrape %s: answered %d", u, resp.StatusCode)
	}
	lr := &io.LimitedReader{R: resp.Body, N: maxScrape + 1}
	s, err := countSeries(lr)
	switch {
	case err != nil:
		return series{}, fmt.Errorf("scrape %s: %w", u, err)
	case lr.N == 0:
		return series{}, fmt.Errorf("scrape %s: more than %d MiB of metrics", u, maxScrape>>20)
	}
	return s, nil
}

// probeStats is what the health probe saw over a phase.
type probeStats struct {
	Lat     []time.Duration
	Answers counts
}

// ok says every probe was answered 2xx within probeTimeout.
func (p probeStats) ok() bool {
	return len(p.Lat) > 0 && p.Answers["2xx"] == len(p.Lat)
}

// probe asks u every probeEvery, a new connection each time as a kubelet
// does, until ctx ends.
func probe(ctx context.Context, hc *http.Client, u string) probeStats {
	st := probeStats{Answers: counts{}}
	for ctx.Err() == nil {
		t0 := time.Now()
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, u, nil)
		if err != nil {
			st.Answers["transport"]++
			return st
		}
		a := do(hc, req)
		st.Lat = append(st.Lat, time.Since(t0))
		st.Answers[a.kind()]++
		if !wait.For(ctx, probeEvery-time.Since(t0)) {
			break
		}
	}
	return st
}

// probeSummary is the probe's p99 and maximum, in ms.
func probeSummary(p probeStats) (p99, maxMS float64) {
	if len(p.Lat) == 0 {
		return 0, 0
	}
	d := measure.Summarize(slices.Clone(p.Lat))
	return d.P99, d.Max
}
