package natstest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/testkit"
)

func ctx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// createStream makes a file-backed stream EVENTS on events.> with a
// duplicates window.
func createStream(t *testing.T, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	st, err := js.CreateStream(ctx(t, 5*time.Second), jetstream.StreamConfig{
		Name:       "EVENTS",
		Subjects:   []string{"events.>"},
		Storage:    jetstream.FileStorage,
		Duplicates: time.Minute,
	})
	require.NoError(t, err)
	return st
}

func TestPublishDeduplicates(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		opts      []natstest.Option
		ids       []string
		wantDup   []bool
		wantMsgs  uint64
		wantMsgID []string
	}{
		{
			name:      "same Nats-Msg-Id twice is a duplicate",
			ids:       []string{"a", "a"},
			wantDup:   []bool{false, true},
			wantMsgs:  1,
			wantMsgID: []string{"a"},
		},
		{
			name:      "different ids are kept",
			ids:       []string{"a", "b"},
			wantDup:   []bool{false, false},
			wantMsgs:  2,
			wantMsgID: []string{"a", "b"},
		},
		{
			name:      "with sync always",
			opts:      []natstest.Option{natstest.WithSyncAlways()},
			ids:       []string{"x", "x", "y"},
			wantDup:   []bool{false, true, false},
			wantMsgs:  2,
			wantMsgID: []string{"x", "y"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t, tc.opts...)
			_, js := srv.Connect(t)
			st := createStream(t, js)

			for i, id := range tc.ids {
				ack, err := js.Publish(ctx(t, 5*time.Second), "events.created", []byte("payload-"+id), jetstream.WithMsgID(id))
				require.NoError(t, err)
				require.Equal(t, "EVENTS", ack.Stream)
				require.Equal(t, tc.wantDup[i], ack.Duplicate, "publish %d (id %q)", i, id)
			}

			info, err := st.Info(ctx(t, 5*time.Second))
			require.NoError(t, err)
			require.Equal(t, tc.wantMsgs, info.State.Msgs)

			msgs := natstest.StreamMessages(t, js, "EVENTS", "")
			var gotIDs []string
			for _, m := range msgs {
				gotIDs = append(gotIDs, m.Header.Get(jetstream.MsgIDHeader))
				require.Equal(t, "payload-"+m.Header.Get(jetstream.MsgIDHeader), string(m.Data))
			}
			require.Equal(t, tc.wantMsgID, gotIDs)
		})
	}
}

// TestOutage stops the server, checks that publishing fails, restarts it on
// the same URL and checks that the stream, its message and its duplicates
// window survived and that a client connected before the outage is back.
func TestOutage(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	url := srv.URL()
	require.True(t, strings.HasPrefix(url, "nats://127.0.0.1:"), url)

	// A client as the relay would configure it: reconnect forever.
	var mu sync.Mutex
	var disconnects, reconnects int
	nc, js := srv.Connect(t,
		nats.DisconnectErrHandler(func(*nats.Conn, error) { mu.Lock(); disconnects++; mu.Unlock() }),
		nats.ReconnectHandler(func(*nats.Conn) { mu.Lock(); reconnects++; mu.Unlock() }),
	)
	createStream(t, js)
	ack, err := js.Publish(ctx(t, 5*time.Second), "events.created", []byte("before"), jetstream.WithMsgID("m1"))
	require.NoError(t, err)
	require.False(t, ack.Duplicate)

	srv.Stop()
	require.Nil(t, srv.NATSServer())
	testkit.WaitFor(t, 5*time.Second, func() bool { return !nc.IsConnected() }, "the client to notice the outage")

	// Publishing fails while the server is down: the old client times out
	// waiting for an ack, a new one cannot connect.
	_, err = js.Publish(ctx(t, 200*time.Millisecond), "events.created", []byte("during"), jetstream.WithMsgID("m2"))
	require.Error(t, err)
	_, err = nats.Connect(url, nats.Timeout(200*time.Millisecond))
	require.ErrorIs(t, err, nats.ErrNoServers)
	srv.Stop() // stopping twice is harmless

	srv.Restart(t)
	require.Equal(t, url, srv.URL())
	require.NotNil(t, srv.NATSServer())
	testkit.WaitFor(t, 5*time.Second, nc.IsConnected, "the old client to reconnect")
	// The handlers run on the client's callback goroutine, after the state
	// change IsConnected reports.
	testkit.WaitFor(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return reconnects == 1
	}, "the reconnect handler")
	mu.Lock()
	require.Equal(t, 1, disconnects)
	mu.Unlock()

	// The stream and its message survived on disk. The message published
	// during the outage may or may not have been buffered and stored after
	// the reconnect; only m1 is certain.
	msgs := natstest.StreamMessages(t, js, "EVENTS", "events.created")
	require.NotEmpty(t, msgs)
	require.Equal(t, "m1", msgs[0].Header.Get(jetstream.MsgIDHeader))
	require.Equal(t, "before", string(msgs[0].Data))
	require.Equal(t, uint64(1), msgs[0].Sequence)

	// Publishing works again, through the old client and a new one, and the
	// duplicates window was recovered too.
	ack, err = js.Publish(ctx(t, 5*time.Second), "events.created", []byte("before"), jetstream.WithMsgID("m1"))
	require.NoError(t, err)
	require.True(t, ack.Duplicate, "duplicates window survives a restart")
	_, js2 := srv.Connect(t)
	ack, err = js2.Publish(ctx(t, 5*time.Second), "events.created", []byte("after"), jetstream.WithMsgID("m3"))
	require.NoError(t, err)
	require.False(t, ack.Duplicate)
	msgs = natstest.StreamMessages(t, js2, "EVENTS", "")
	require.Equal(t, "m3", msgs[len(msgs)-1].Header.Get(jetstream.MsgIDHeader))
}

// TestRestartWhileRunning restarts a running server in place, twice.
func TestRestartWhileRunning(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	createStream(t, js)
	for i := range 2 {
		before := srv.NATSServer()
		srv.Restart(t)
		require.NotSame(t, before, srv.NATSServer())
		// IsConnected alone can still report the old connection, before
		// the client noticed the restart: a publish then goes into the
		// dead socket and its reply never comes.
		testkit.WaitFor(t, 5*time.Second, func() bool {
			return nc.Stats().Reconnects == uint64(i+1) && nc.IsConnected()
		}, "reconnect")
		_, err := js.Publish(ctx(t, 5*time.Second), "events.created", fmt.Appendf(nil, "%d", i))
		require.NoError(t, err)
	}
	require.Len(t, natstest.StreamMessages(t, js, "EVENTS", ""), 2)
}

// TestWithStoreDir starts a second server on a stopped one's store.
func TestWithStoreDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := natstest.Start(t, natstest.WithStoreDir(dir))
	require.Equal(t, dir, first.StoreDir())
	_, js := first.Connect(t)
	createStream(t, js)
	_, err := js.Publish(ctx(t, 5*time.Second), "events.created", []byte("kept"))
	require.NoError(t, err)
	first.Stop()

	second := natstest.Start(t, natstest.WithStoreDir(dir))
	_, js = second.Connect(t)
	msgs := natstest.StreamMessages(t, js, "EVENTS", "")
	require.Len(t, msgs, 1)
	require.Equal(t, "kept", string(msgs[0].Data))
}

func TestMaxPayload(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		opts    []natstest.Option
		size    int
		wantErr error
	}{
		{"1 KiB within 1 KiB limit", []natstest.Option{natstest.WithMaxPayload(1024)}, 1024, nil},
		{"2 KiB over 1 KiB limit", []natstest.Option{natstest.WithMaxPayload(1024)}, 2048, nats.ErrMaxPayload},
		{"2 KiB with the default limit", nil, 2048, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t, tc.opts...)
			nc, js := srv.Connect(t)
			createStream(t, js)
			_, err := js.Publish(ctx(t, 5*time.Second), "events.big", make([]byte, tc.size))
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.ErrorIs(t, nc.Publish("events.big", make([]byte, tc.size)), tc.wantErr)
				require.Empty(t, natstest.StreamMessages(t, js, "EVENTS", ""))
				return
			}
			require.NoError(t, err)
			msgs := natstest.StreamMessages(t, js, "EVENTS", "")
			require.Len(t, msgs, 1)
			require.Len(t, msgs[0].Data, tc.size)
		})
	}
}

func TestStreamMessages(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	st := createStream(t, js)
	for i, subj := range []string{"events.a", "events.b", "events.a", "events.b", "events.a"} {
		_, err := js.Publish(ctx(t, 5*time.Second), subj, fmt.Appendf(nil, "%d", i+1),
			jetstream.WithMsgID(fmt.Sprintf("id-%d", i+1)))
		require.NoError(t, err)
	}
	// A hole in the middle: sequence 3 deleted.
	require.NoError(t, st.DeleteMsg(ctx(t, 5*time.Second), 3))

	cases := []struct {
		filter  string
		wantSeq []uint64
	}{
		{"", []uint64{1, 2, 4, 5}},
		{">", []uint64{1, 2, 4, 5}},
		{"events.a", []uint64{1, 5}},
		{"events.b", []uint64{2, 4}},
		{"events.*", []uint64{1, 2, 4, 5}},
		{"events.none", nil},
	}
	for _, tc := range cases {
		t.Run("filter="+tc.filter, func(t *testing.T) {
			t.Parallel()
			var got []uint64
			for _, m := range natstest.StreamMessages(t, js, "EVENTS", tc.filter) {
				got = append(got, m.Sequence)
				require.Equal(t, fmt.Sprint(m.Sequence), string(m.Data))
				require.Equal(t, fmt.Sprintf("id-%d", m.Sequence), m.Header.Get(jetstream.MsgIDHeader))
			}
			require.Equal(t, tc.wantSeq, got)
		})
	}
}

func TestStreamMessagesEmpty(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	createStream(t, js)
	require.Empty(t, natstest.StreamMessages(t, js, "EVENTS", ""))
}
