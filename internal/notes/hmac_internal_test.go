package notes

import (
	"crypto/hmac"
	"crypto/sha256"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// hmacSHA256 is crypto/hmac's HMAC-SHA256 for keys and messages of every
// length around the block size and the stack buffer's size.
func TestHMACSHA256(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, keyLen := range []int{0, 1, 31, 32, 33, 63, 64, 65, 100} {
		for _, msgLen := range []int{0, 1, 55, 64, 200, 255, 256, 257, 1000} {
			key, msg := make([]byte, keyLen), make([]byte, msgLen)
			for i := range key {
				key[i] = byte(rng.Uint32())
			}
			for i := range msg {
				msg[i] = byte(rng.Uint32())
			}
			m := hmac.New(sha256.New, key)
			m.Write(msg)
			got := hmacSHA256(key, msg)
			require.Equal(t, m.Sum(nil), got[:], "key %d bytes, message %d", keyLen, msgLen)
		}
	}
}

// A derivation allocates nothing: it runs on every create.
func TestDerivationsDoNotAllocate(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	note := NoteID(secret, "acme", "k1", 0)
	allocs := testing.AllocsPerRun(100, func() {
		_ = NoteID(secret, "acme", "a-key-of-some-length-0001", 3)
		_ = AttachmentID(note)
		_ = NoteEventID(note, 7, "a-key-of-some-length-0001")
		_ = ProcessedEventID(note)
	})
	require.Zero(t, allocs)
}
