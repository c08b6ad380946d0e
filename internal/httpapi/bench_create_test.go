package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
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
func BenchmarkCreateHandler(b *testing.B) { benchCreate(b, false) }

// BenchmarkCreateHandlerGrouped is BenchmarkCreateHandler with the creates'
// transactions carried by a db.Group, as "api serve" runs them by default
// (QUILL_WRITE_GROUP, decision 0103): below the one-transaction floor.
func BenchmarkCreateHandlerGrouped(b *testing.B) { benchCreate(b, true) }

func benchCreate(b *testing.B, grouped bool) {
	pool, _ := dbtest.Pool(b, 16)
	reg := metrics.NewRegistry()
	m := metrics.NewAPI(reg, contract.ActionCreateNote, contract.ActionDeleteNote)
	log := zerolog.New(io.Discard).With().Str("process", "api").Logger()
	opts := []notes.Option{notes.WithObserver(m)}
	var g *db.Group
	if grouped {
		var err error
		g, err = db.NewGroup(pool, db.CreateGroupConfig(pool.Config().MaxConns))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(g.Close)
		opts = append(opts, notes.WithGroup(g))
	}
	svc, err := notes.NewService(pool, notes.Config{}, log, opts...)
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
	var st0 db.GroupStats
	if g != nil {
		st0 = g.Stats()
	}
	cpu0 := processCPU(b)
	b.ResetTimer()
	auth := "Bearer " + tok
	b.RunParallel(func(pb *testing.PB) {
		w := &benchWriter{}
		for pb.Next() {
			key := strconv.AppendInt(append(make([]byte, 0, 24), "bench-"...), n.Add(1), 10)
			w.reset()
			h.ServeHTTP(w, createRequest(auth, body, string(key)))
			if w.code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.code, w.body.String())
			}
		}
	})
	b.StopTimer()
	// The process's CPU per create — what the target is about;
	// ns/op is mostly waiting for PostgreSQL.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	if g != nil {
		// How many creates a write carried: what the group saves.
		st := g.Stats()
		b.ReportMetric(float64(st.Txs-st0.Txs)/float64(max(1, st.Flushes-st0.Flushes)), "tx/write")
	}
}

// createURL is the path every create is sent to.
var createURL = &url.URL{Path: "/v1/notes"}

// createRequest is a create as net/http's server hands it to a handler
// after reading it from a kept-alive connection: a Request, its header map
// and its body. httptest.NewRequest parses a request line through a new
// 4 KiB bufio.Reader each time, which a server does not (its reader is the
// connection's) — 15 % of the bytes the benchmark allocated per create
// were that parse's, not the API's (issue 29).
func createRequest(auth, body, key string) *http.Request {
	return &http.Request{
		Method: http.MethodPost, URL: createURL, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Authorization": {auth}, "Content-Type": {"application/json"}, "Idempotency-Key": {key}},
		Body:   io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
		Host: "quill.test", RemoteAddr: "192.0.2.1:40000", RequestURI: "/v1/notes",
	}
}

// benchWriter is a ResponseWriter as a server's is per request: a header
// map of its own, the status, and the body written into a buffer that the
// connection keeps (a server's bufio.Writer).
type benchWriter struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (w *benchWriter) reset() { w.h, w.code = make(http.Header, 4), 0; w.body.Reset() }

func (w *benchWriter) Header() http.Header { return w.h }

func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *benchWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.body.Write(p)
}

// processCPU is the CPU time, user and system, this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
