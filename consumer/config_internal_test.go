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

// awaitingEarlier holds a note's first-seen later version back until the
// hold-back delays of its deliveries add up to 1.5 × AckWait, and never at
// the delivery before MaxDeliver.
func TestAwaitingEarlier(t *testing.T) {
	t.Parallel()
	// Delays 200ms, 400ms, 800ms, 1.6s, 3.2s, 6.4s … (MaxNakDelay 1m).
	cfg := Config{AckWait: 5 * time.Second, HoldBackDelay: 200 * time.Millisecond, MaxNakDelay: time.Minute, MaxDeliver: 10}
	for _, tc := range []struct {
		name string
		cfg  Config
		n    int
		want bool
	}{
		{"first delivery: nothing waited", cfg, 1, true},
		{"after 6.2 s of hold-backs, below 7.5 s", cfg, 6, true},
		{"after 12.6 s, past 1.5 × AckWait", cfg, 7, false},
		{"the delivery before MaxDeliver is never held", func() Config { c := cfg; c.AckWait = time.Hour; return c }(), 9, false},
		{"MaxDeliver 1: never held", func() Config { c := cfg; c.MaxDeliver = 1; return c }(), 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.cfg.awaitingEarlier(tc.n); got != tc.want {
				t.Fatalf("awaitingEarlier(%d) = %v, want %v", tc.n, got, tc.want)
			}
		})
	}
}
