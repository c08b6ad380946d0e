package relay_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
)

// TestNoPublishBufferedAcrossAReconnect reproduces the reorder of issue 12:
// relay A publishes e1 while its NATS connection is down; relay B publishes
// and marks e1 and then e2; once the duplicate window has passed, A's
// connection comes back. Had A's client buffered the publish, it would
// flush it now and the stream would hold e1, e2, e1. With
// relay.ConnOptions the publish failed at once, and e1 stayed in the
// outbox for B.
func TestNoPublishBufferedAcrossAReconnect(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const window = 2 * time.Second
	cfg := relay.Config{
		Stream:       stream.Config{Name: h.stream, SubjectPrefix: h.prefix, DuplicateWindow: window, MaxAge: time.Hour},
		Lease:        500 * time.Millisecond,
		PollInterval: 100 * time.Millisecond,
		MaxBackoff:   100 * time.Millisecond,
		AckTimeout:   300 * time.Millisecond,
		Batch:        8,
	}
	b, _ := h.newRelay(cfg, h.relayID("b"))
	require.NoError(t, b.Provision(h.ctx()))

	// Relay A reaches NATS through a switch that can cut it off.
	sw, proxied := dbtest.NewSwitch(t, h.srv.URL())
	ncA, err := nats.Connect(proxied, append([]nats.Option{nats.Name("relay-a"), nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(0, 0)}, relay.ConnOptions()...)...)
	require.NoError(t, err)
	t.Cleanup(ncA.Close)
	poolA, err := db.Open(t.Context(), h.url, 2)
	require.NoError(t, err)
	t.Cleanup(poolA.Close)
	a, err := relay.New(poolA, ncA, cfg, testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()), relay.WithID(h.relayID("a")))
	require.NoError(t, err)

	note := uuid.New()
	e1 := h.write(h.tenant, note, contract.EventNoteCreated)
	e2 := h.write(h.tenant, note, contract.EventNoteDeleted)

	sw.Set(dbtest.Refused)
	testkit.WaitFor(t, 10*time.Second, func() bool { return !ncA.IsConnected() }, "relay A's connection to be down")
	n, err := a.Pass(h.ctx())
	require.Equal(t, 1, n, "A claims e1, the oldest event of the note")
	require.Error(t, err, "A's publish of e1 is not acknowledged")
	require.Zero(t, h.published())

	// B takes over: e1, then e2.
	testkit.WaitFor(t, 10*time.Second, func() bool {
		_, err := b.Pass(h.ctx())
		return err == nil && h.published() == 2
	}, "relay B to publish and mark e1 and e2")
	markedAt := time.Now()

	// Past the duplicate window the stream no longer knows e1's id.
	testkit.WaitFor(t, 2*window, func() bool { return time.Since(markedAt) > window+200*time.Millisecond },
		"the duplicate window to pass")
	sw.Set(dbtest.Up)
	testkit.WaitFor(t, 10*time.Second, ncA.IsConnected, "relay A's connection to be back")
	require.NoError(t, ncA.Flush(), "whatever A's client held is at the server now")

	var ids []string
	for _, m := range streamMessages(t, h.js, h.stream) {
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	require.Equal(t, []string{e1.String(), e2.String()}, ids, "e1, e2 once each and in order (e1=%s e2=%s)", e1, e2)
}

// New refuses a connection that would buffer publishes while reconnecting.
func TestNewRefusesABufferingConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	nc, _ := h.srv.Connect(t)
	_, err := relay.New(h.pool, nc, h.config(), testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()))
	require.ErrorIs(t, err, relay.ErrReconnectBuffer)
}
