package idempotency

import (
	"container/list"
	"sync"
)

// Cache keeps recently seen committed records in memory, least recently
// used out first, within a byte budget. A committed record never changes —
// compaction and forgetting are decided by time, which Decide checks — so a
// cached record answers a replay exactly as the database would, without a
// round trip. A record that is not in the cache is simply read from the
// database.
type Cache struct {
	mu     sync.Mutex
	budget int
	used   int
	ll     *list.List
	items  map[cacheKey]*list.Element
}

type cacheKey struct{ tenant, key string }

// recordOverhead approximates a record's memory besides its body and key:
// the struct, the per-field hash map, the list element and the index entry.
const recordOverhead = 1536

// NewCache returns a cache of at most budget bytes; budget <= 0 disables it
// (every Get misses, Put keeps nothing).
func NewCache(budget int) *Cache {
	return &Cache{budget: budget, ll: list.New(), items: make(map[cacheKey]*list.Element)}
}

func size(r *Record) int { return recordOverhead + len(r.Key) + len(r.Body) + len(r.Fingerprint) }

// Get returns the cached record of (tenant, key), or nil.
func (c *Cache) Get(tenant, key string) *Record {
	if c == nil || c.budget <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[cacheKey{tenant, key}]
	if !ok {
		return nil
	}
	c.ll.MoveToFront(e)
	return e.Value.(*Record)
}

// Put remembers a committed record. Records larger than a quarter of the
// budget are not kept.
func (c *Cache) Put(r *Record) {
	if c == nil || c.budget <= 0 || r == nil {
		return
	}
	n := size(r)
	if n > c.budget/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey{r.Tenant, r.Key}
	if e, ok := c.items[k]; ok {
		c.used -= size(e.Value.(*Record))
		e.Value = r
		c.ll.MoveToFront(e)
	} else {
		c.items[k] = c.ll.PushFront(r)
	}
	c.used += n
	for c.used > c.budget {
		last := c.ll.Back()
		old := last.Value.(*Record)
		c.ll.Remove(last)
		delete(c.items, cacheKey{old.Tenant, old.Key})
		c.used -= size(old)
	}
}

// Forget drops (tenant, key), e.g. once its record was deleted.
func (c *Cache) Forget(tenant, key string) {
	if c == nil || c.budget <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[cacheKey{tenant, key}]; ok {
		c.used -= size(e.Value.(*Record))
		c.ll.Remove(e)
		delete(c.items, cacheKey{tenant, key})
	}
}
