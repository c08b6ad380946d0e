package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
)

// tripRecorder records, per round trip, the statements a pool sends and
// their arguments: a batch is one trip, a statement sent alone another.
type tripRecorder struct {
	mu    sync.Mutex
	on    bool
	trips [][]stmt
}

// stmt is one statement as sent.
type stmt struct {
	sql  string
	args []any
}

func (r *tripRecorder) start() { r.mu.Lock(); r.on, r.trips = true, nil; r.mu.Unlock() }

func (r *tripRecorder) stop() [][]stmt {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	return r.trips
}

func (r *tripRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	if r.on {
		r.trips = append(r.trips, []stmt{{d.SQL, d.Args}})
	}
	r.mu.Unlock()
	return ctx
}
func (r *tripRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *tripRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	if r.on {
		r.trips = append(r.trips, nil)
	}
	r.mu.Unlock()
	return ctx
}
func (r *tripRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mu.Lock()
	if r.on && len(r.trips) > 0 {
		r.trips[len(r.trips)-1] = append(r.trips[len(r.trips)-1], stmt{d.SQL, d.Args})
	}
	r.mu.Unlock()
}
func (r *tripRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// floorCreate is what one create sent, recorded twice (two keys, the same
// fields): the statements, per trip, and which arguments are the
// create's own (they differ between the two) — what the floor sends anew
// each time, at the same sizes.
type floorCreate struct {
	trips [][]stmt
	// own[trip][stmt][arg] is true for an argument that differs between
	// the two recorded creates.
	own [][][]bool
	// key, note and event are the second create's own values, substituted
	// wherever they appear.
	key           string
	note, event   uuid.UUID
	noteS, eventS string
	// at is when the second create was sent: a time argument is moved
	// by as much as the clock moved since (expiry horizons keep their
	// distance from the creation time).
	at time.Time
}

// recordCreate sends two creates through h (keys keyA and keyB) with rec
// recording, and returns the second's trips with the arguments marked
// that are a create's own.
func recordCreate(b *testing.B, h http.Handler, rec *tripRecorder, pool *pgxpool.Pool, tok, body, keyA, keyB string) *floorCreate {
	b.Helper()
	send := func(key string) ([][]stmt, []byte) {
		rec.start()
		resp := postCreate(b, h, tok, body, key)
		return rec.stop(), resp
	}
	a, _ := send(keyA)
	at := time.Now()
	bt, resp := send(keyB)
	if len(a) != len(bt) {
		b.Fatalf("two creates sent %d and %d trips", len(a), len(bt))
	}
	// The floor sends plain values, converted once here.
	for _, trips := range [][][]stmt{a, bt} {
		for _, trip := range trips {
			for _, st := range trip {
				for k, v := range st.args {
					st.args[k] = plain(v)
				}
			}
		}
	}
	f := &floorCreate{trips: bt, key: keyB, at: at}
	for i := range bt {
		if len(a[i]) != len(bt[i]) {
			b.Fatalf("trip %d: %d and %d statements", i, len(a[i]), len(bt[i]))
		}
		var own [][]bool
		for j := range bt[i] {
			if a[i][j].sql != bt[i][j].sql || len(a[i][j].args) != len(bt[i][j].args) {
				b.Fatalf("trip %d statement %d differs between two creates", i, j)
			}
			o := make([]bool, len(bt[i][j].args))
			for k := range o {
				o[k] = !reflect.DeepEqual(a[i][j].args[k], bt[i][j].args[k])
			}
			own = append(own, o)
		}
		f.own = append(f.own, own)
	}
	var out struct {
		ID uuid.UUID `json:"id"`
	}
	if err := json.Unmarshal(resp, &out); err != nil {
		b.Fatalf("note id of %s: %v", resp, err)
	}
	f.note = out.ID
	if err := pool.QueryRow(b.Context(), `SELECT id FROM outbox_events WHERE operation_key = $1`, keyB).Scan(&f.event); err != nil {
		b.Fatal(err)
	}
	f.noteS, f.eventS = f.note.String(), f.event.String()
	return f
}

// args returns trip i statement j's arguments with the create's own
// replaced by new ones of the same size: the key, the note and event ids
// wherever they appear, other ids and numbers at random, times now.
func (f *floorCreate) args(i, j int, key string, note, event uuid.UUID) []any {
	src := f.trips[i][j].args
	out := make([]any, len(src))
	for k, v := range src {
		if !f.own[i][j][k] {
			out[k] = v
			continue
		}
		switch x := v.(type) {
		case string:
			// Only what the recorded value holds is replaced: the
			// floor's own work must stay small beside the driver's.
			if x == f.key {
				out[k] = key
				continue
			}
			if strings.Contains(x, f.key) {
				x = strings.ReplaceAll(x, f.key, key)
			}
			if strings.Contains(x, f.noteS) {
				x = strings.ReplaceAll(x, f.noteS, note.String())
			}
			if strings.Contains(x, f.eventS) {
				x = strings.ReplaceAll(x, f.eventS, event.String())
			}
			out[k] = x
		case []byte:
			if bytes.Contains(x, []byte(f.noteS)) {
				x = bytes.ReplaceAll(x, []byte(f.noteS), []byte(note.String()))
			}
			if bytes.Contains(x, []byte(f.eventS)) {
				x = bytes.ReplaceAll(x, []byte(f.eventS), []byte(event.String()))
			}
			out[k] = x
		case pgtype.UUID:
			switch uuid.UUID(x.Bytes) {
			case f.note:
				out[k] = pgtype.UUID{Bytes: note, Valid: true}
			case f.event:
				out[k] = pgtype.UUID{Bytes: event, Valid: true}
			default:
				out[k] = pgtype.UUID{Bytes: uuid.New(), Valid: x.Valid}
			}
		case uuid.UUID:
			switch x {
			case f.note:
				out[k] = note
			case f.event:
				out[k] = event
			default:
				out[k] = uuid.New()
			}
		case int64:
			out[k] = rand.Int64()
		case time.Time:
			out[k] = x.Add(time.Since(f.at))
		case pgtype.Timestamptz:
			x.Time = x.Time.Add(time.Since(f.at))
			out[k] = x
		default:
			out[k] = v
		}
	}
	return out
}

// plain returns a parameter the handler kept in its transaction's db.Args
// as the plain value pgx takes from a program of its own: the floor is
// the driver's cost for the values, not for Quill's way of passing them.
func plain(v any) any {
	switch x := v.(type) {
	case string, []byte, int64, pgtype.UUID, pgtype.Timestamptz, nil:
		return v
	case pgtype.TextValuer:
		t, _ := x.TextValue()
		return t.String
	case pgtype.TimestamptzValuer:
		t, _ := x.TimestamptzValue()
		return t
	case pgtype.UUIDValuer:
		u, _ := x.UUIDValue()
		return u
	case pgtype.BytesValuer:
		b, _ := x.BytesValue()
		return b
	case pgtype.Int64Valuer:
		i, _ := x.Int64Value()
		return i.Int64
	}
	return v
}

// postCreate sends one create through h under key and returns its answer's
// body; anything but 201 fails b.
func postCreate(b *testing.B, h http.Handler, tok, body, key string) []byte {
	b.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/notes", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusCreated {
		b.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	return w.Body.Bytes()
}

// BenchmarkCreateFloor is issue 29's floor: exactly the statements a create
// sends — recorded from BenchmarkCreateHandler's own handler, with their
// arguments at the same sizes, the create's own values (key, ids, lock,
// times) made anew — in the same round trips, through pgx alone, from as
// many goroutines. Its cpu-µs/op is what the driver and PostgreSQL's wire
// protocol cost the process per create; BenchmarkCreateHandler's over it is
// Quill's own work (make bench-api prints the ratio of their medians).
func BenchmarkCreateFloor(b *testing.B) {
	rec := &tripRecorder{}
	base, _ := dbtest.Pool(b, 16)
	cfg := base.Config().Copy()
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	log := zerolog.New(io.Discard)
	m := metrics.NewAPI(metrics.NewRegistry(), contract.ActionCreateNote, contract.ActionDeleteNote)
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
	// Warm: the token's cache, the id secret, the statements' preparation.
	for _, key := range []string{"bench-warm-000000000001", "bench-warm-000000000002"} {
		postCreate(b, h, tok, body, key)
	}
	f := recordCreate(b, h, rec, pool, tok, body, "bench-record-0000000001", "bench-record-0000000002")
	if len(f.trips) == 0 {
		b.Fatal("a create sent nothing")
	}
	// The floor's pool has no tracer: the handler's has none in production.
	floor := base

	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(4)
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			key := fmt.Sprintf("bench-%017d", n.Add(1))
			note, event := uuid.New(), uuid.New()
			conn, err := floor.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			for i := range f.trips {
				batch := &pgx.Batch{}
				for j := range f.trips[i] {
					batch.Queue(f.trips[i][j].sql, f.args(i, j, key, note, event)...)
				}
				if err := conn.SendBatch(ctx, batch).Close(); err != nil {
					conn.Release()
					b.Errorf("trip %d: %v", i, err)
					return
				}
			}
			conn.Release()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	var notesMade int
	if err := floor.QueryRow(context.Background(), `SELECT count(*) FROM notes WHERE tenant = 'bench'`).Scan(&notesMade); err != nil {
		b.Fatal(err)
	}
	if notesMade < b.N {
		b.Fatalf("the floor made %d notes for %d creates: its statements did not write what a create writes", notesMade, b.N)
	}
}
