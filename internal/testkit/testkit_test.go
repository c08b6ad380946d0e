package testkit_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
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

// fakeTB records a failure instead of failing the real test; FailNow ends
// the calling goroutine as testing.T's does.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	errs   []string
	failed bool
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *fakeTB) FailNow() {
	f.mu.Lock()
	f.failed = true
	f.mu.Unlock()
	runtime.Goexit()
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		trueFrom int // cond returns true from this call on; 0 never
		wantFail bool
	}{
		{"already true", 1, false},
		{"true on the third poll", 3, false},
		{"never true", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeTB{TB: t}
			var calls int
			cond := func() bool {
				calls++
				return tc.trueFrom > 0 && calls >= tc.trueFrom
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				testkit.WaitFor(f, 100*time.Millisecond, cond, "the thing")
			}()
			<-done
			f.mu.Lock()
			defer f.mu.Unlock()
			require.Equal(t, tc.wantFail, f.failed)
			if tc.wantFail {
				require.Len(t, f.errs, 1)
				require.Contains(t, f.errs[0], "after 100ms waiting for the thing")
			} else {
				require.Equal(t, tc.trueFrom, calls)
			}
		})
	}
}
