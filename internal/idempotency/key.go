// Package idempotency holds the pieces of Quill's idempotency contract that do
// not depend on a particular action: operation-key syntax, canonical parameter
// fingerprints, the operation record and its storage, the decision a recorded
// operation implies for a new request, and in-process coalescing of
// concurrent requests with one key.
package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// MaxKeyLen is the longest operation key accepted, in bytes (= characters, as
// keys are ASCII).
const MaxKeyLen = 255

// ErrKeyMissing is returned by ParseKeyHeader when no Idempotency-Key header
// was sent.
var ErrKeyMissing = errors.New("Idempotency-Key header is missing")

// ErrKeyInvalid is wrapped by ParseKeyHeader and ParseKey for every malformed
// key; the wrapping error says what is wrong.
var ErrKeyInvalid = errors.New("invalid operation key")

// ParseKeyHeader returns the operation key carried by the values of the
// Idempotency-Key header. Exactly one header line is accepted. It returns
// ErrKeyMissing when values is empty and an error wrapping ErrKeyInvalid for a
// repeated header or a malformed value.
func ParseKeyHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
		return ParseKey(values[0])
	default:
		return "", fmt.Errorf("%w: the header is repeated", ErrKeyInvalid)
	}
}

// ParseKey parses one key, sent bare (abc) or as an RFC 8941 sf-string
// ("abc"); both forms name the same key. A key is 1–255 characters, each
// 0x21–0x7E except '"' and ','. It returns an error wrapping ErrKeyInvalid.
func ParseKey(v string) (string, error) {
	if v == "" {
		return "", fmt.Errorf("%w: the key is empty", ErrKeyInvalid)
	}
	key := v
	if v[0] == '"' {
		s, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = s
	}
	if err := checkKey(key); err != nil {
		return "", err
	}
	return key, nil
}

func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: the key is empty", ErrKeyInvalid)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: the key is %d characters long, the limit is %d", ErrKeyInvalid, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == ',' {
			return fmt.Errorf("%w: character %d (%s) is not allowed; use printable ASCII without spaces, '\"' or ','", ErrKeyInvalid, i+1, describeByte(c))
		}
	}
	return nil
}

// parseSFString parses an RFC 8941 §3.3.3 string that must make up all of v.
func parseSFString(v string) (string, error) {
	buf := make([]byte, 0, len(v))
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape in quoted key", ErrKeyInvalid)
			}
			buf = append(buf, v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: data after the closing quote (lists are not accepted)", ErrKeyInvalid)
			}
			return string(buf), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: character %d (%s) is not allowed", ErrKeyInvalid, i+1, describeByte(c))
		default:
			buf = append(buf, c)
		}
	}
	return "", fmt.Errorf("%w: the quoted key has no closing quote", ErrKeyInvalid)
}

func describeByte(c byte) string {
	if c >= 0x21 && c <= 0x7e {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02X", c)
}

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

// KeyHash is a short, non-reversible handle on (tenant, key) for logs, so an
// operation can be correlated without logging the key itself.
func KeyHash(tenant, key string) string {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:6])
}
