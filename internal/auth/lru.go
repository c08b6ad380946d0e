package auth

import "container/list"

// lru is a map bounded to max entries that evicts the least recently used
// one: the negative cache and the per-address limiters are keyed by what an
// attacker chooses (tokens, addresses), so their size must not be.
// It is not safe for concurrent use; the Authenticator's mutex guards it.
type lru[K comparable, V any] struct {
	max   int
	order *list.List // front: most recently used; values are *lruEntry
	items map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key K
	val V
}

func newLRU[K comparable, V any](max int) *lru[K, V] {
	return &lru[K, V]{max: max, order: list.New(), items: make(map[K]*list.Element, min(max, 1024))}
}

// get returns key's value and marks it used.
func (l *lru[K, V]) get(key K) (V, bool) {
	el, ok := l.items[key]
	if !ok {
		var zero V
		return zero, false
	}
	l.order.MoveToFront(el)
	return el.Value.(*lruEntry[K, V]).val, true
}

// put sets key's value, evicting the least recently used entry when full.
func (l *lru[K, V]) put(key K, val V) {
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

// remove forgets key.
func (l *lru[K, V]) remove(key K) {
	if el, ok := l.items[key]; ok {
		l.order.Remove(el)
		delete(l.items, key)
	}
}

func (l *lru[K, V]) len() int { return l.order.Len() }
