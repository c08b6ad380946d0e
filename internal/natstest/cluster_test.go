package natstest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
)

// A three-node cluster elects a meta leader, replicates an R3 stream, moves
// its leadership on request, and a node stopped while writes go on catches
// up after its restart on the same ports and data.
func TestCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	require.Len(t, c.Servers(), 3)
	require.Len(t, strings.Split(c.URLs(), ","), 3)
	require.GreaterOrEqual(t, c.MetaLeader(), 0)

	_, js := c.Connect(t)
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "R3", Subjects: []string{"r3.>"}, Storage: jetstream.FileStorage, Replicas: 3,
	})
	require.NoError(t, err)
	c.WaitForStreamReplicas(t, js, "R3", 3)
	cons, err := js.CreateOrUpdateConsumer(ctx, "R3", jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	c.WaitHealthy(t)
	// A publish in flight when the client's node goes away gets no answer:
	// it is sent again with its message id, which the stream deduplicates.
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprint(i)
			testkit.WaitFor(t, 30*time.Second, func() bool {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				_, err := js.Publish(pctx, "r3.x", []byte(id), jetstream.WithMsgID(id))
				return err == nil
			}, "publish "+id)
		}
	}
	publish(0, 10)

	leader := c.StreamLeader(t, "R3")
	next := c.StepDownStreamLeader(t, "R3")
	require.NotEqual(t, leader, next)
	meta := c.WaitForLeader(t)
	require.NotEqual(t, meta, c.StepDownMetaLeader(t))

	// Stop a follower: the stream keeps quorum and accepts writes.
	follower := (c.StreamLeader(t, "R3") + 1) % 3
	url := c.URL(follower)
	c.Stop(follower)
	c.Stop(follower) // stopping twice is harmless
	require.Nil(t, c.Servers()[follower])
	publish(10, 20)

	c.Restart(t, follower)
	require.Equal(t, url, c.URL(follower), "same client port after restart")
	c.WaitForStreamReplicas(t, js, "R3", 3)
	testkit.WaitFor(t, 30*time.Second, func() bool {
		ns := c.Servers()[follower]
		return ns != nil && ns.JetStreamIsStreamCurrent(natstest.Account, "R3")
	}, "the restarted node to be current on R3")
	c.WaitHealthy(t) // streams and consumers current on every node
	st, err := js.Stream(ctx, "R3")
	require.NoError(t, err)
	require.Equal(t, uint64(20), st.CachedInfo().State.Msgs)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(20), info.NumPending, "the replicated consumer kept its place across the restart")
	require.Len(t, natstest.StreamMessages(t, js, "R3", ""), 20)
}
