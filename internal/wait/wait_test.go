package wait_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/wait"
)

func TestBackoffGrowsToMaxAndResets(t *testing.T) {
	t.Parallel()
	b := wait.Backoff{Base: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	for n, ceiling := range []time.Duration{10, 20, 40, 80, 80, 80} {
		d := b.Next()
		require.GreaterOrEqual(t, d, time.Millisecond, "attempt %d", n)
		require.LessOrEqual(t, d, ceiling*time.Millisecond+time.Millisecond, "attempt %d", n)
	}
	b.Reset()
	for range 20 {
		require.LessOrEqual(t, b.Next(), 80*time.Millisecond+time.Millisecond)
	}
	b.Reset()
	require.LessOrEqual(t, b.Next(), 11*time.Millisecond, "the first delay after Reset is within Base")
}
