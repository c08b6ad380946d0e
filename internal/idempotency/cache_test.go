package idempotency

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCacheEvictsLeastRecentlyUsedWithinBudget(t *testing.T) {
	t.Parallel()
	rec := func(tenant, key string, body int) *Record {
		return &Record{Tenant: tenant, Key: key, Body: make([]byte, body)}
	}
	c := NewCache(10 * (recordOverhead + 2 + 100))
	for i := range 10 {
		c.Put(rec("acme", fmt.Sprintf("k%d", i), 100))
	}
	require.NotNil(t, c.Get("acme", "k0")) // k0 is now the most recent
	c.Put(rec("acme", "k10", 100))         // evicts k1, the least recent
	require.Nil(t, c.Get("acme", "k1"))
	require.NotNil(t, c.Get("acme", "k0"))
	require.NotNil(t, c.Get("acme", "k10"))
	require.Nil(t, c.Get("globex", "k0"), "tenants are separate")
	require.LessOrEqual(t, c.used, c.budget)

	c.Put(rec("acme", "huge", c.budget)) // over a quarter of the budget: not kept
	require.Nil(t, c.Get("acme", "huge"))
	c.Forget("acme", "k0")
	require.Nil(t, c.Get("acme", "k0"))

	off := NewCache(0)
	off.Put(rec("acme", "k", 1))
	require.Nil(t, off.Get("acme", "k"))
	var nilCache *Cache
	require.Nil(t, nilCache.Get("acme", "k"))
}

// Two operations whose hashes collide (made here by moving one's element
// to the other's hash) never answer for each other: a Get or a Forget of
// the one finds the other's record and leaves it, a Put replaces it.
func TestCacheCollisionIsAMiss(t *testing.T) {
	t.Parallel()
	c := NewCache(1 << 20)
	a := &Record{Tenant: "acme", Key: "a", Body: []byte("a's")}
	b := &Record{Tenant: "acme", Key: "b", Body: []byte("b's answer")}
	c.Put(a)
	e := c.items[c.hash("acme", "a")]
	delete(c.items, c.hash("acme", "a"))
	c.items[c.hash("acme", "b")] = e
	require.Nil(t, c.Get("acme", "b"), "a's record answered for b")
	c.Forget("acme", "b")
	require.Equal(t, 1, c.ll.Len(), "b's Forget removed a's record")
	c.Put(b)
	require.Equal(t, 1, c.ll.Len())
	require.Same(t, b, c.Get("acme", "b"))
	require.Equal(t, size(b), c.used)
}
