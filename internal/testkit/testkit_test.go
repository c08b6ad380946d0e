package testkit_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/testkit"
)

func TestScrubIDsAndTimes(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ in, want string }{
		"uuid":  {`{"id":"01a229cf-df18-7352-9441-e88e7d76d895"}`, `{"id":"00000000-0000-0000-0000-000000000000"}`},
		"time":  {`{"at":"2026-11-30T00:16:58.648139Z"}`, `{"at":"2006-01-02T15:04:05.000000Z"}`},
		"other": {`{"n":"2026-11-30"}`, `{"n":"2026-11-30"}`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, string(testkit.ScrubIDsAndTimes([]byte(tc.in))))
		})
	}
}

func TestGolden(t *testing.T) {
	t.Parallel()
	require.FileExists(t, filepath.Join("testdata", "example.json"))
	want, err := os.ReadFile(filepath.Join("testdata", "example.json"))
	require.NoError(t, err)
	testkit.Golden(t, "example.json", want)
	testkit.Golden(t, "example.json", []byte(`{"id":"01a229cf-df18-7352-9441-e88e7d76d895"}`+"\n"), testkit.ScrubIDsAndTimes)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"k"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "h"})
	reg.MustRegister(c, g)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	g.Set(7)
	require.Equal(t, 3.0, testkit.Value(c.WithLabelValues("b")))
	require.Equal(t, 7.0, testkit.Value(g))
	require.Equal(t, 2.0, testkit.Gathered(t, reg, "c_total", map[string]string{"k": "a"}))
	require.Equal(t, 7.0, testkit.Gathered(t, reg, "g", nil))
	require.Equal(t, 0.0, testkit.Gathered(t, reg, "missing", nil))

	go func() { g.Set(9) }()
	testkit.RequireMetric(t, 5*time.Second, g, 9)
}
