package httpapi

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAppendMillis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		us   int64
		want string
	}{
		{0, "0"}, {1, "0.001"}, {10, "0.01"}, {100, "0.1"}, {412, "0.412"}, {1000, "1"},
		{1500, "1.5"}, {60_000_123, "60000.123"}, {1<<43 - 1, "8796093022.207"}, {1 << 43, "8796093022.208"},
		{-1500, "-1.5"},
	} {
		got := string(appendMillis([]byte("x"), tc.us))[1:]
		require.Equal(t, tc.want, got, "%d µs", tc.us)
		require.Equal(t, strconv.FormatFloat(float64(tc.us)/1000, 'f', -1, 64), got, "%d µs", tc.us)
	}
}

// FuzzAppendMillis holds appendMillis to what the log line wrote before,
// strconv's shortest form of the float.
func FuzzAppendMillis(f *testing.F) {
	for _, us := range []int64{0, 1, 999, 1000, 1001, 123456, 1<<43 - 1, 1 << 43, 1 << 62, -1} {
		f.Add(us)
	}
	f.Fuzz(func(t *testing.T, us int64) {
		require.Equal(t, strconv.AppendFloat(nil, float64(us)/1000, 'f', -1, 64), appendMillis(nil, us), "%d µs", us)
	})
}
