// Package idempotency is Quill's idempotency protocol, for every action:
// canonical parameter fingerprints, the operation record and its storage,
// the decision a recorded operation implies for a new request, in-process
// coalescing of concurrent requests with one key, and Protocol, which runs
// an operation — claim, decide, execute and record in one transaction,
// replay, wait, recheck a lost COMMIT — from the plan its action gives. The
// key's syntax is package opkey's.
package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
)

// LockID is the PostgreSQL advisory-lock id of (tenant, key): whoever holds
// it is executing that operation. Collisions only make two unrelated keys
// wait for each other, never share an outcome.
func LockID(tenant, key string) int64 {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}
