package metrics_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/testkit"
)

func TestNewRegistryExportsBuildInfo(t *testing.T) {
	t.Parallel()
	families, err := metrics.NewRegistry().Gather()
	require.NoError(t, err)
	var got *dto.MetricFamily
	for _, f := range families {
		if f.GetName() == "quill_build_info" {
			got = f
		}
	}
	require.NotNil(t, got, "quill_build_info is exported")
	require.Equal(t, dto.MetricType_GAUGE, got.GetType())
	require.Len(t, got.GetMetric(), 1)
	m := got.GetMetric()[0]
	require.Equal(t, 1.0, m.GetGauge().GetValue())
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	info := buildinfo.Read()
	require.Equal(t, map[string]string{"version": info.Version, "goversion": info.GoVersion}, labels,
		"the version --version prints")
	require.NotEmpty(t, info.Version)
	require.NotEmpty(t, info.GoVersion)
}

// quill_http_request_duration_seconds observes each request under its
// route and method (not its code: the histogram's buckets are per series).
func TestHTTPRequestObservesDuration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.NewAPI(reg)
	m.HTTPRequest("POST /v1/notes", "POST", 201, 30*time.Millisecond)
	m.HTTPRequest("POST /v1/notes", "POST", 409, 3*time.Second)
	families, err := reg.Gather()
	require.NoError(t, err)
	var h *dto.Histogram
	for _, f := range families {
		if f.GetName() == "quill_http_request_duration_seconds" {
			require.Len(t, f.GetMetric(), 1, "one series per route and method")
			h = f.GetMetric()[0].GetHistogram()
		}
	}
	require.NotNil(t, h, "quill_http_request_duration_seconds is exported")
	require.Equal(t, uint64(2), h.GetSampleCount())
	require.InDelta(t, 3.03, h.GetSampleSum(), 1e-9)
	for _, b := range h.GetBucket() {
		switch b.GetUpperBound() {
		case .025:
			require.Equal(t, uint64(0), b.GetCumulativeCount())
		case .05:
			require.Equal(t, uint64(1), b.GetCumulativeCount())
		case 5:
			require.Equal(t, uint64(2), b.GetCumulativeCount())
		}
	}
	require.Equal(t, 1.0, testkit.Gathered(t, reg, "quill_http_requests_total", map[string]string{"code": "409"}))
}

// Each count lands in its own series, however many series the API has
// seen, and from many goroutines at once (the children's copy-on-write
// map under -race); a series seen before costs no allocation.
func TestAPICountsEachSeries(t *testing.T) {
	// Not parallel: AllocsPerRun counts the whole process's allocations.
	reg := prometheus.NewRegistry()
	m := metrics.NewAPI(reg, "create_note")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				code := 200 + (g+i)%7
				m.HTTPRequest("POST /v1/notes", "POST", code, time.Millisecond)
				m.Idempotency("create_note", []string{"executed", "replayed"}[i%2])
				m.BusinessEffect(fmt.Sprintf("action-%d", i%3))
			}
		})
	}
	wg.Wait()
	var requests float64
	for code := 200; code < 207; code++ {
		requests += testkit.Gathered(t, reg, "quill_http_requests_total", map[string]string{"code": strconv.Itoa(code)})
	}
	require.Equal(t, 200.0, requests)
	require.Equal(t, 100.0, testkit.Gathered(t, reg, "quill_idempotency_requests_total", map[string]string{"action": "create_note", "outcome": "executed"}))
	require.Equal(t, 100.0, testkit.Gathered(t, reg, "quill_idempotency_requests_total", map[string]string{"action": "create_note", "outcome": "replayed"}))
	require.Equal(t, 0.0, testkit.Gathered(t, reg, "quill_idempotency_requests_total", map[string]string{"action": "create_note", "outcome": "key_reused"}))
	for i, want := range []float64{4 * 17, 4 * 17, 4 * 16} { // i%3 over 50
		require.Equal(t, want, testkit.Gathered(t, reg, "quill_business_effects_total", map[string]string{"action": fmt.Sprintf("action-%d", i)}))
	}
	allocs := testing.AllocsPerRun(100, func() {
		m.HTTPRequest("POST /v1/notes", "POST", 201, time.Millisecond)
		m.Idempotency("create_note", "executed")
		m.BusinessEffect("create_note")
	})
	require.Zero(t, allocs)
}
