package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/testkit"
)

// TestReadyFollowsPostgres: while PostgreSQL is unreachable — refusing
// connections, or silent — Ready fails (within the deadline of its context,
// as /readyz gives it) and names PostgreSQL; once it is back Ready succeeds
// again, and the events committed meanwhile are published.
func TestReadyFollowsPostgres(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		outage dbtest.State
	}{
		{"refused", dbtest.Refused},
		{"silent", dbtest.Silent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			sw, proxied := dbtest.NewSwitch(t, h.url)
			pool, err := db.Open(t.Context(), proxied, 4)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			nc, _ := h.srv.Connect(t, relay.ConnOptions()...)
			r, err := relay.New(pool, nc, h.config(), testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()),
				relay.WithID(h.relayID("ready-"+tc.name)))
			require.NoError(t, err)
			require.NoError(t, r.Provision(h.ctx()))
			start(t, r)
			t.Cleanup(func() { sw.Set(dbtest.Up) }) // before the relay stops, should the test fail while down

			// ready asks as /readyz does, with two seconds to answer.
			ready := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				errc := make(chan error, 1)
				go func() { errc <- r.Ready(ctx) }()
				select {
				case err := <-errc:
					return err
				case <-time.After(15 * time.Second):
					sw.Set(dbtest.Up) // let the call return before the test ends
					require.FailNow(t, "Ready did not return within 15s of a 2s deadline")
					return nil
				}
			}

			require.NoError(t, ready())
			h.write(h.tenant, uuid.New(), contract.EventNoteCreated)
			h.waitPublished(1)

			sw.Set(tc.outage)
			var notReady error
			testkit.WaitFor(t, waitLong, func() bool { notReady = ready(); return notReady != nil },
				"Ready to fail while PostgreSQL is unreachable")
			require.ErrorContains(t, notReady, "postgres")
			t.Logf("not ready: %v", notReady)
			require.Error(t, ready(), "still unreachable: still not ready")
			for range 2 {
				h.write(h.tenant, uuid.New(), contract.EventNoteCreated) // straight to the server
			}

			sw.Set(dbtest.Up)
			testkit.WaitFor(t, waitLong, func() bool { return ready() == nil }, "Ready once PostgreSQL is back")
			h.waitPublished(3)
			h.requireExactlyOnce(3)
		})
	}
}
