package contract_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
)

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{720 * time.Hour, "720h"},
		{72 * time.Hour, "72h"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + 30*time.Second, "1h0m30s"},
		{time.Hour + time.Second, "1h0m1s"},
		{10 * time.Minute, "10m"},
		{90 * time.Second, "1m30s"},
		{30 * time.Second, "30s"},
		{1500 * time.Millisecond, "1.5s"},
		{time.Hour + 500*time.Millisecond, "1h0m0.5s"},
		{500 * time.Millisecond, "500ms"},
		{0, "0s"},
	} {
		got := contract.FormatDuration(tc.in)
		require.Equal(t, tc.want, got, "%v", tc.in)
		back, err := time.ParseDuration(got)
		require.NoError(t, err)
		require.Equal(t, tc.in, back, "%q reads back", got)
	}
}
