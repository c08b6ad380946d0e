// Package testkit holds the helpers Quill's tests share: golden files, a
// test logger, reading a metric, waiting for a condition, unique name
// suffixes, and a source file's string constants. It is imported only
// from _test.go files.
package testkit

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// update is the one -update flag of every test binary that compares golden
// files.
var update = flag.Bool("update", false, "rewrite the golden files under testdata")

var (
	uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z`)
)

// ScrubIDsAndTimes replaces every UUID and every RFC 3339 time with
// microseconds by a fixed one, so that a golden file pins a body's shape
// rather than the values of one run.
func ScrubIDsAndTimes(b []byte) []byte {
	b = uuidRE.ReplaceAll(b, []byte("00000000-0000-0000-0000-000000000000"))
	return timeRE.ReplaceAll(b, []byte("2006-01-02T15:04:05.000000Z"))
}

// Golden compares got with testdata/name, after applying each scrub to got;
// with -update it rewrites the file first.
func Golden(t testing.TB, name string, got []byte, scrub ...func([]byte) []byte) {
	t.Helper()
	for _, s := range scrub {
		got = s(got)
	}
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -update to create %s", path)
	require.Equal(t, string(want), string(got))
}

// Logger returns a logger that writes through t when the tests run with -v
// and discards everything otherwise.
func Logger(t testing.TB) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}

// Value reads a counter's or a gauge's value, or a histogram's count of
// observations, as prometheus/testutil's ToFloat64 would (testutil needs a
// module this one does not require). It panics when the metric cannot be
// written, which only a broken collector does.
func Value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	if m.Histogram != nil {
		return float64(m.Histogram.GetSampleCount())
	}
	return m.Gauge.GetValue()
}

// Gathered returns the value of the counter or gauge name in reg whose
// labels include labels, or 0 when there is none.
func Gathered(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// UniqueSuffix returns ten random lower-case hex digits, different at each
// call, for the names of what parallel tests share a server or a database
// under: streams, subject prefixes, consumers, tenants.
func UniqueSuffix() string {
	return strings.ReplaceAll(uuid.NewString(), "-", "")[:10]
}

// WaitFor polls cond every 10 ms until it holds, failing t after timeout with
// msg. Tests wait with it instead of sleeping for a fixed time.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			if cond() {
				return
			}
			require.FailNowf(t, "timed out", "after %s waiting for %s", timeout, msg)
		case <-tick.C:
		}
	}
}

// RequireReturned waits up to timeout for what a Run loop sends on done
// once its context ended, and requires it to be nil: a graceful stop.
func RequireReturned(t testing.TB, done <-chan error, timeout time.Duration, msgAndArgs ...any) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err, msgAndArgs...)
	case <-time.After(timeout):
		require.FailNow(t, "Run did not return after its context ended")
	}
}

// RequireMetric waits until c reaches want, then requires it to equal want:
// a component often counts just after the effect a test saw, so reading the
// count at once could be a moment early.
func RequireMetric(t testing.TB, timeout time.Duration, c prometheus.Metric, want float64) {
	t.Helper()
	WaitFor(t, timeout, func() bool { return Value(c) >= want }, fmt.Sprintf("the metric to reach %v", want))
	require.Equal(t, want, Value(c))
}
