// Package lru is a map bounded to a number of entries that evicts the
// least recently used one, for the caches and limiters keyed by what a
// caller chooses (tokens, addresses): their size must not be the caller's
// choice. Standard library only, so that driver-free programs (quill mcp)
// use it too.
package lru

import "container/list"

// Cache is a map bounded to max entries that evicts the least recently
// used one. It is not safe for concurrent use: its owner's mutex guards it.
type Cache[K comparable, V any] struct {
	max   int
	order *list.List // front: most recently used; values are *lruEntry
	items map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key K
	val V
}

// New returns an empty Cache of at most max entries.
func New[K comparable, V any](max int) *Cache[K, V] {
	return &Cache[K, V]{max: max, order: list.New(), items: make(map[K]*list.Element, min(max, 1024))}
}

// Get returns key's value and marks it used.
func (l *Cache[K, V]) Get(key K) (V, bool) {
	el, ok := l.items[key]
	if !ok {
		var zero V
		return zero, false
	}
	l.order.MoveToFront(el)
	return el.Value.(*lruEntry[K, V]).val, true
}

// Put sets key's value, evicting the least recently used entry when full.
func (l *Cache[K, V]) Put(key K, val V) {
	if el, ok := l.items[key]; ok {
		el.Value.(*lruEntry[K, V]).val = val
		l.order.MoveToFront(el)
		return
	}
	if l.order.Len() >= l.max {
		oldest := l.order.Back()
		l.order.Remove(oldest)
		delete(l.items, oldest.Value.(*lruEntry[K, V]).key)
	}
	l.items[key] = l.order.PushFront(&lruEntry[K, V]{key: key, val: val})
}

// Remove forgets key.
func (l *Cache[K, V]) Remove(key K) {
	if el, ok := l.items[key]; ok {
		l.order.Remove(el)
		delete(l.items, key)
	}
}

// Len is the number of entries.
func (l *Cache[K, V]) Len() int { return l.order.Len() }
