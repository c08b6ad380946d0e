package auth_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
)

// TestAddressBudget: each address has its burst of failures; a success
// gives its share back; past the burst Take refuses with the wait until the
// bucket holds one again; an IPv6 /64 is one address; the bucket refills.
func TestAddressBudget(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	cases := []struct {
		name string
		// attempts are (address, succeeded) in order; want is whether
		// each is allowed.
		attempts [][2]any
		want     []bool
	}{
		{name: "burst then refused", attempts: [][2]any{{"192.0.2.1", false}, {"192.0.2.1", false}, {"192.0.2.1", false}},
			want: []bool{true, true, false}},
		{name: "another address has its own", attempts: [][2]any{{"192.0.2.1", false}, {"192.0.2.1", false}, {"192.0.2.2:4000", false}},
			want: []bool{true, true, true}},
		{name: "host:port is its host", attempts: [][2]any{{"192.0.2.1:1", false}, {"192.0.2.1:2", false}, {"192.0.2.1", false}},
			want: []bool{true, true, false}},
		{name: "successes cost nothing", attempts: [][2]any{{"192.0.2.1", true}, {"192.0.2.1", true}, {"192.0.2.1", true}, {"192.0.2.1", false}, {"192.0.2.1", false}},
			want: []bool{true, true, true, true, true}},
		{name: "an IPv6 /64 is one address", attempts: [][2]any{{"[2001:db8::1]:1", false}, {"2001:db8::2", false}, {"2001:db8::3", false}, {"2001:db8:0:1::1", false}},
			want: []bool{true, true, false, true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := auth.NewAddressBudget(0.1, 2)
			for i, a := range tc.attempts {
				giveBack, err := b.Take(a[0].(string), now)
				if !tc.want[i] {
					var rl *auth.RateLimitedError
					require.True(t, errors.As(err, &rl), "attempt %d: %v", i, err)
					require.ErrorIs(t, err, auth.ErrRateLimited)
					require.Equal(t, 10*time.Second, rl.RetryAfter, "one failure's worth at 0.1/s")
					continue
				}
				require.NoError(t, err, "attempt %d", i)
				if a[1].(bool) {
					giveBack()
				}
			}
		})
	}

	t.Run("refills", func(t *testing.T) {
		t.Parallel()
		b := auth.NewAddressBudget(0.1, 1)
		_, err := b.Take("192.0.2.9", now)
		require.NoError(t, err)
		_, err = b.Take("192.0.2.9", now.Add(5*time.Second))
		var rl *auth.RateLimitedError
		require.True(t, errors.As(err, &rl))
		require.Equal(t, 5*time.Second, rl.RetryAfter)
		_, err = b.Take("192.0.2.9", now.Add(10*time.Second))
		require.NoError(t, err)
	})
}
