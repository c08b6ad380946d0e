package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
)

// BenchmarkCreateHandler is a create through the API's whole handler as
// "api serve" wires it — cached token, metrics, request log line, replay
// cache, the pipelined transaction on real PostgreSQL — without the
// network, so that -cpuprofile shows where the API's own CPU per create
// goes (issue 18). b.N creates of unique keys, by GOMAXPROCS×4 goroutines.
func BenchmarkCreateHandler(b *testing.B) {
	pool, _ := dbtest.Pool(b, 16)
	reg := metrics.NewRegistry()
	m := metrics.NewAPI(reg, contract.ActionCreateNote, contract.ActionDeleteNote)
	log := zerolog.New(io.Discard).With().Str("process", "api").Logger()
	svc, err := notes.NewService(pool, notes.Config{}, log, notes.WithObserver(m))
	if err != nil {
		b.Fatal(err)
	}
	h := httpapi.NewServer(httpapi.Deps{Pool: pool, Auth: auth.NewAuthenticator(pool, 5*time.Second), Notes: svc, Log: log, Metrics: m})
	tok, err := auth.Create(b.Context(), pool, "bench", time.Now())
	if err != nil {
		b.Fatal(err)
	}
	body := `{"title":"groceries","body":"milk, eggs, bread and a bag of coffee beans for the week"}`
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(4)
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/v1/notes", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%d", n.Add(1)))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body.String())
			}
		}
	})
	b.StopTimer()
	// The process's CPU per create — what the target is about;
	// ns/op is mostly waiting for PostgreSQL.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// processCPU is the CPU time, user and system, this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
