package notes_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/notes"
)

// newGrouped is a service over a pool of conns connections to url whose
// creates travel through a db.Group of lanes lanes, as "api serve" runs
// them (QUILL_WRITE_GROUP): a shared commit per flush.
func newGrouped(t *testing.T, url string, conns int32, lanes int) (*notes.Service, *db.Group) {
	t.Helper()
	pool, err := db.Open(context.Background(), url, conns)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	g, err := db.NewGroup(pool, db.GroupConfig{Lanes: lanes, SharedCommit: true}.WithDefaults(pool.Config().MaxConns))
	require.NoError(t, err)
	t.Cleanup(g.Close)
	svc, err := notes.NewService(pool, notes.Config{Wait: 2 * time.Second, ReplayCacheBytes: -1}, zerolog.New(io.Discard), notes.WithGroup(g))
	require.NoError(t, err)
	return svc, g
}

// Creates carried several to a write by a group keep the contract: each
// key makes one note, its concurrent retries are replays (or in progress)
// with the executed answer's body, a key reused for other parameters is
// refused, and the writes were shared (more transactions than flushes).
// Two services stand for two API processes, so that their requests meet
// in the database rather than in one process's Flights.
func TestGroupedCreatesExecuteOnce(t *testing.T) {
	t.Parallel()
	_, u := dbtest.Pool(t, 2)
	a, ga := newGrouped(t, u, 4, 2)
	b, gb := newGrouped(t, u, 4, 2)
	check, err := db.Open(context.Background(), u, 2)
	require.NoError(t, err)
	t.Cleanup(check.Close)
	tenant := reviewTenant()

	const keys, per = 24, 6
	var wg sync.WaitGroup
	var executed, replayed, busy, refused atomic.Int64
	bodies := make([]sync.Map, keys)
	for k := range keys {
		for i := range per {
			wg.Go(func() {
				svc := []*notes.Service{a, b}[i%2]
				title := "same"
				if i == per-1 {
					title = "other" // the key reused for another intent
				}
				out, err := svc.Create(context.Background(),
					notes.Request{Tenant: tenant, Key: fmt.Sprintf("k-%d", k), Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: title})
				var reused *idempotency.KeyReusedError
				switch {
				case errors.As(err, &reused):
					refused.Add(1)
				case errors.Is(err, idempotency.ErrInProgress):
					busy.Add(1)
				case err != nil:
					t.Errorf("key %d: %v", k, err)
				case out.Replayed:
					replayed.Add(1)
					bodies[k].Store(string(out.Body), true)
				default:
					executed.Add(1)
					bodies[k].Store(string(out.Body), true)
				}
			})
		}
	}
	wg.Wait()
	require.Equal(t, keys, countNotes(t, check, tenant), "one note per key")
	require.LessOrEqual(t, executed.Load(), int64(keys))
	for k := range keys {
		n := 0
		bodies[k].Range(func(any, any) bool { n++; return true })
		require.LessOrEqual(t, n, 1, "key %d was answered with more than one body", k)
	}
	var events int
	require.NoError(t, check.QueryRow(context.Background(),
		`SELECT count(*) FROM outbox_events WHERE tenant = $1 AND type = 'note.created'`, tenant).Scan(&events))
	require.Equal(t, keys, events, "one note.created per note")
	sa, sb := ga.Stats(), gb.Stats()
	t.Logf("executed %d, replayed %d, in progress %d, refused %d; group a %+v, b %+v",
		executed.Load(), replayed.Load(), busy.Load(), refused.Load(), sa, sb)
	require.Greater(t, sa.Txs+sb.Txs, sa.Flushes+sb.Flushes, "no write carried more than one transaction")
}

// A grouped create whose write's reply is lost is answered with its
// outcome, found by the recheck, like a create of its own round trip.
func TestGroupedCreateLostReplyIsRechecked(t *testing.T) {
	t.Parallel()
	_, u := dbtest.Pool(t, 2)
	proxy, proxied := dbtest.NewProxy(t, u)
	svc, _ := newGrouped(t, proxied, 2, 1)
	tenant := reviewTenant()
	_, err := svc.Create(t.Context(), notes.Request{Tenant: tenant, Key: "warm", Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: "warm"})
	require.NoError(t, err)

	proxy.LoseNextReply()
	out, err := svc.Create(t.Context(), notes.Request{Tenant: tenant, Key: "lost", Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: "lost"})
	require.Equal(t, 1, proxy.Cuts(), "the reply was lost")
	require.NoError(t, err, "the write committed and the database is reachable: the recheck should find it")
	require.Equal(t, notes.OutcomeCreated, out.Outcome)
	again, err := svc.Create(t.Context(), notes.Request{Tenant: tenant, Key: "lost", Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: "lost"})
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, string(out.Body), string(again.Body))
}
