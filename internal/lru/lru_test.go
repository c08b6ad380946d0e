package lru_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/lru"
)

func TestLRUEvictsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	l := lru.New[int, string](2)
	l.Put(1, "a")
	l.Put(2, "b")
	_, _ = l.Get(1)
	l.Put(3, "c") // evicts 2
	_, ok := l.Get(2)
	require.False(t, ok)
	v, ok := l.Get(1)
	require.True(t, ok)
	require.Equal(t, "a", v)
	l.Put(1, "A")
	v, _ = l.Get(1)
	require.Equal(t, "A", v)
	require.Equal(t, 2, l.Len())
	l.Remove(1)
	require.Equal(t, 1, l.Len())
}
