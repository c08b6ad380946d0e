package consumer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNakDelayDoublesPerDeliveryUpToTheCap(t *testing.T) {
	t.Parallel()
	c := Config{NakDelay: time.Second, MaxNakDelay: 10 * time.Second}
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		4: 8 * time.Second, 5: 10 * time.Second, 100: 10 * time.Second} {
		require.Equal(t, want, c.nakDelay(n), "delivery %d", n)
	}
}

func TestHoldBackDelayDoublesPerDeliveryUpToTheCap(t *testing.T) {
	t.Parallel()
	c := Config{Durable: "d", MaxNakDelay: time.Second}.WithDefaults()
	require.Equal(t, DefaultHoldBackDelay, c.HoldBackDelay)
	for n, want := range map[int]time.Duration{1: 200 * time.Millisecond, 2: 400 * time.Millisecond, 3: 800 * time.Millisecond,
		4: time.Second, 100: time.Second} {
		require.Equal(t, want, c.holdBackDelay(n), "delivery %d", n)
	}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no durable", Config{}, "Config.Durable is required"},
		{"durable with a dot", Config{Durable: "a.b"}, "Config.Durable"},
		{"stream with a wildcard", Config{Durable: "d", Stream: "S*"}, "Config.Stream"},
		{"concurrency", Config{Durable: "d", Concurrency: -1}, "Config.Concurrency"},
		{"ack wait", Config{Durable: "d", AckWait: time.Millisecond}, "Config.AckWait"},
		{"max deliver", Config{Durable: "d", MaxDeliver: -1}, "Config.MaxDeliver"},
		{"max ack pending", Config{Durable: "d", Concurrency: 8, MaxAckPending: 4}, "Config.MaxAckPending"},
		{"nak delays", Config{Durable: "d", NakDelay: time.Minute, MaxNakDelay: time.Second}, "Config.MaxNakDelay"},
		{"handler timeout", Config{Durable: "d", HandlerTimeout: time.Millisecond}, "Config.HandlerTimeout"},
		{"filter", Config{Durable: "d", FilterSubjects: []string{"quill..x"}}, "Config.FilterSubjects"},
		{"prefix", Config{Durable: "d", TablePrefix: "Bad-"}, "Config.TablePrefix"},
		{"max batch", Config{Durable: "d", MaxBatch: -1}, "Config.MaxBatch"},
		{"max batch wait", Config{Durable: "d", MaxBatchWait: -time.Millisecond}, "Config.MaxBatchWait"},
		{"batch timeout", Config{Durable: "d", BatchTimeout: 2 * time.Minute}, "Config.BatchTimeout"},
		{"pending interval", Config{Durable: "d", PendingInterval: -time.Second}, "Config.PendingInterval"},
		{"versions", Config{Durable: "d", Versions: "strict"}, `Config.Versions "strict" must be "", "skip-stale" or "in-order"`},
		{"hold-back delay", Config{Durable: "d", HoldBackDelay: -time.Second}, "Config.HoldBackDelay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.WithDefaults().validate()
			require.ErrorContains(t, err, tc.want)
		})
	}
	require.NoError(t, Config{Durable: "projection"}.WithDefaults().validate())
	for _, v := range []VersionGuard{VersionsOff, VersionsSkipStale, VersionsInOrder} {
		require.NoError(t, Config{Durable: "projection", Versions: v}.WithDefaults().validate())
	}
}

func TestConsumerConfigLeavesDeliveriesToTheConsumer(t *testing.T) {
	t.Parallel()
	cc := Config{Durable: "p", FilterSubjects: []string{"quill.*.note.created", "quill.*.note.deleted"}}.WithDefaults().ConsumerConfig()
	require.Equal(t, -1, cc.MaxDeliver)
	require.Empty(t, cc.BackOff)
	require.Empty(t, cc.FilterSubject)
	require.Equal(t, []string{"quill.*.note.created", "quill.*.note.deleted"}, cc.FilterSubjects)
	require.Equal(t, DefaultAckWait, cc.AckWait)
}
