package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/logging"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
)

// Thousands of invented methods — short ones, and 60 KiB ones as in the
// security review, without a token, answered 401 — leave the metrics with
// the methods the API routes and _OTHER only, the log lines without the
// invented strings, and the heap where it was: a label value minted per
// request was a series, and its string, kept for the process's life.
//
// Not parallel: the heap it measures is the process's.
func TestInventedMethodsMintNoSeries(t *testing.T) {
	pool, _ := dbtest.Pool(t, 4)
	var logs clitest.SyncBuffer
	log, err := logging.New(&logs, "info", "api")
	require.NoError(t, err)
	svc, err := notes.NewService(pool, notes.Config{}, log)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m := metrics.NewAPI(reg, contract.ActionCreateNote, contract.ActionDeleteNote)
	api := httpapi.NewServer(httpapi.Deps{Pool: pool, Notes: svc, Log: log, Metrics: m})

	send := func(method, path string) int {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Method = method // any token net/http would accept
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		return rec.Code
	}
	// One of each routed method first, so that the baseline's series
	// exist before the heap is read.
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete, "PUT"} {
		send(m, "/v1/notes")
		send(m, "/nowhere")
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	long := strings.Repeat("A", 60<<10)
	for i := range 3000 {
		method := fmt.Sprintf("INVENTED%d", i)
		if i%3 == 0 {
			method = fmt.Sprintf("%s%dN", long, i)
		}
		path := "/v1/notes"
		if i%2 == 0 {
			path = "/nowhere"
		}
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusNotFound}, send(method, path))
	}
	after := heap()

	families, err := reg.Gather()
	require.NoError(t, err)
	series := 0
	for _, f := range families {
		if f.GetName() != "quill_http_requests_total" && f.GetName() != "quill_http_request_duration_seconds" {
			continue
		}
		for _, mt := range f.GetMetric() {
			series++
			for _, l := range mt.GetLabel() {
				switch l.GetName() {
				case "method":
					require.Contains(t, []string{"GET", "HEAD", "POST", "DELETE", "_OTHER"}, l.GetValue())
				case "route":
					require.Contains(t, []string{"/v1/notes", "unmatched"}, l.GetValue())
				}
			}
		}
	}
	require.LessOrEqual(t, series, 24, "series of quill_http_*: routes × routed methods and _OTHER × codes")
	// 1,000 methods of 60 KiB are 60 MiB if anything keeps them.
	require.Less(t, int64(after)-int64(before), int64(16<<20), "heap before %d, after %d", before, after)

	out := logs.String()
	require.NotContains(t, out, "INVENTED")
	require.NotContains(t, out, "AAAA")
	require.Contains(t, out, `"method":"_OTHER"`)
}
