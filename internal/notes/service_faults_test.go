package notes_test

// Fault tests of the write path (the one production runs; a create is one
// statement in one round trip): concurrency across processes, and the
// re-check of a lost COMMIT reply.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/notes"
)

func reviewService(t *testing.T, pool *pgxpool.Pool, wait time.Duration) *notes.Service {
	t.Helper()
	svc, err := notes.NewService(pool, notes.Config{Wait: wait, ReplayCacheBytes: -1}, zerolog.New(io.Discard))
	require.NoError(t, err)
	return svc
}

func reviewTenant() string { return "rv-" + uuid.NewString()[:8] }

func countNotes(t *testing.T, pool *pgxpool.Pool, tenant string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM notes WHERE tenant = $1`, tenant).Scan(&n))
	return n
}

// Sound: several "processes" (services over their own pools, so Flights do
// not coalesce them) race on one key through the one-round-trip guarded
// claim; exactly one note per key, every other answer a replay or 409.
func TestProductionPathConcurrentAcrossProcessesExecutesOnce(t *testing.T) {
	t.Parallel()
	_, u := dbtest.Pool(t, 2)
	var svcs []*notes.Service
	for range 4 {
		p, err := db.Open(context.Background(), u, 8)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		svcs = append(svcs, reviewService(t, p, 2*time.Second))
	}
	check, err := db.Open(context.Background(), u, 2)
	require.NoError(t, err)
	t.Cleanup(check.Close)
	tenant := reviewTenant()
	const rounds, per = 30, 16
	for round := range rounds {
		key := fmt.Sprintf("k-%d", round)
		var wg sync.WaitGroup
		var executed, replayed, busy atomic.Int64
		for i := range per {
			wg.Go(func() {
				out, err := svcs[i%len(svcs)].Create(context.Background(),
					notes.Request{Tenant: tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: "same"})
				switch {
				case errors.Is(err, idempotency.ErrInProgress):
					busy.Add(1)
				case err != nil:
					t.Errorf("round %d: %v", round, err)
				case out.Replayed:
					replayed.Add(1)
				default:
					executed.Add(1)
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, executed.Load(), "round %d", round)
	}
	require.Equal(t, rounds, countNotes(t, check, tenant))
}

// delayProxy forwards PostgreSQL traffic. Once armed, it takes the next
// client→server chunk that starts with Bind (a pipelined batch of prepared
// statements), cuts the client's connection at once and delivers the chunk
// to the server only after delay — as a TCP retransmission after a
// partition, or any buffering proxy, would.
type delayProxy struct {
	ln        net.Listener
	target    string
	delay     time.Duration
	armed     atomic.Bool
	delivered chan struct{}
}

func newDelayProxy(t *testing.T, dbURL string, delay time.Duration) (*delayProxy, string) {
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &delayProxy{ln: ln, target: u.Host, delay: delay, delivered: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			answered := make(chan struct{})
			go func() { _, _ = io.Copy(c, s); c.Close(); close(answered) }()
			go p.clientToServer(c, s, answered)
		}
	}()
	u.Host = ln.Addr().String()
	return p, u.String()
}

// clientToServer forwards c's messages to s. answered closes when the copy
// the other way ends: once c is cut, at the server's first bytes back or at
// the end of its session.
func (p *delayProxy) clientToServer(c, s net.Conn, answered <-chan struct{}) {
	buf := make([]byte, 1<<16)
	for {
		n, err := c.Read(buf)
		if err != nil {
			s.Close()
			return
		}
		chunk := append([]byte(nil), buf[:n]...)
		if chunk[0] == 'B' && p.armed.CompareAndSwap(true, false) {
			c.Close() // the client sees its connection fail mid-COMMIT round trip
			// The fault itself, not a wait: the batch is held back for delay.
			time.Sleep(p.delay)
			_, _ = s.Write(chunk) // ... and the server receives the batch late
			// The server has run the batch (or ended the session) when it
			// answers.
			select {
			case <-answered:
			case <-time.After(10 * time.Second):
			}
			s.Close()
			close(p.delivered)
			return
		}
		if _, err := s.Write(chunk); err != nil {
			c.Close()
			return
		}
	}
}

// The lost-COMMIT recheck must not conclude "nothing was committed" merely
// because it can take the key's lock and finds no record: the old session's
// batch may not have reached its backend yet, and could then claim the free
// lock and commit — a 503 "nothing committed" for a write that committed
// (SPEC §3: 503 "sent only when nothing was committed").
func TestRecheckEndsTheOldSessionBeforeSayingNothingCommitted(t *testing.T) {
	t.Parallel()
	direct, u := dbtest.Pool(t, 2)
	proxy, proxied := newDelayProxy(t, u, 1500*time.Millisecond)
	svc, tenant := warmService(t, proxied, 4)
	ctx := t.Context()

	proxy.armed.Store(true)
	_, err := svc.Create(ctx, notes.Request{Tenant: tenant, Key: "late", Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: "late"})
	var unavail *idempotency.UnavailableError
	require.ErrorAs(t, err, &unavail)
	<-proxy.delivered

	var ops int
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM operations WHERE tenant = $1 AND key = 'late'`, tenant).Scan(&ops))
	if !unavail.Unknown && ops == 1 {
		t.Errorf("the API answered 503 %q, yet the operation committed (%d note(s) for the tenant)", unavail.Error(), countNotes(t, direct, tenant))
	}
}

// warmService is a service for a new tenant over a pool of conns
// connections to url, warmed by one create: its statements are prepared, so
// the next create is one chunk of Bind/Execute messages, COMMIT included.
func warmService(t *testing.T, url string, conns int32) (*notes.Service, string) {
	t.Helper()
	pool, err := db.Open(context.Background(), url, conns)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	svc := reviewService(t, pool, 2*time.Second)
	tenant := reviewTenant()
	_, err = svc.Create(t.Context(), notes.Request{Tenant: tenant, Key: "warm", Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: "warm"})
	require.NoError(t, err)
	return svc, tenant
}

// The recheck must not need a second pool slot: when every slot is held by
// a write whose COMMIT reply was lost (a pool of 1 here; a failover under
// load with a pool's size of in-flight writes in general), a recheck that
// cannot acquire a connection would wait its 5 s and answer "outcome
// unknown", although the database is up and the answer (201) is one query
// away.
func TestRecheckWorksWithAFullPool(t *testing.T) {
	t.Parallel()
	_, u := dbtest.Pool(t, 2)
	proxy, proxied := dbtest.NewProxy(t, u)
	svc, tenant := warmService(t, proxied, 1)
	ctx := t.Context()

	proxy.LoseNextReply()
	start := time.Now()
	out, err := svc.Create(ctx, notes.Request{Tenant: tenant, Key: "lost", Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: "lost"})
	require.Equal(t, 1, proxy.Cuts())
	require.NoError(t, err, "after %s: the COMMIT succeeded and the database is reachable; the recheck should find it", time.Since(start))
	require.Equal(t, notes.OutcomeCreated, out.Outcome)
}
