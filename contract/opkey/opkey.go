// Package opkey is the syntax of an operation key (SPEC §3): parsing one from
// the Idempotency-Key header or a command line, and a short hash of it for
// logs. It imports only the standard library, so the client and the CLI can
// check a key without linking the server's storage.
package opkey

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// MaxLen is the longest operation key accepted, in bytes (= characters, as
// keys are ASCII).
const MaxLen = 255

// ErrMissing is returned by ParseHeader when no Idempotency-Key header was
// sent.
var ErrMissing = errors.New("Idempotency-Key header is missing")

// ErrInvalid is wrapped by ParseHeader and Parse for every malformed key; the
// wrapping error says what is wrong.
var ErrInvalid = errors.New("invalid operation key")

// ParseHeader returns the operation key carried by the values of the
// Idempotency-Key header. Exactly one header line is accepted. It returns
// ErrMissing when values is empty and an error wrapping ErrInvalid for a
// repeated header or a malformed value.
func ParseHeader(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrMissing
	case 1:
		return Parse(values[0])
	default:
		return "", fmt.Errorf("%w: the header is repeated", ErrInvalid)
	}
}

// Parse parses one key, sent bare (abc) or as an RFC 8941 sf-string ("abc");
// both forms name the same key. A key is 1–255 characters, each 0x21–0x7E
// except '"' and ','. It returns an error wrapping ErrInvalid.
func Parse(v string) (string, error) {
	if v == "" {
		return "", fmt.Errorf("%w: the key is empty", ErrInvalid)
	}
	key := v
	if v[0] == '"' {
		s, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = s
	}
	if err := check(key); err != nil {
		return "", err
	}
	return key, nil
}

func check(key string) error {
	if key == "" {
		return fmt.Errorf("%w: the key is empty", ErrInvalid)
	}
	if len(key) > MaxLen {
		return fmt.Errorf("%w: the key is %d characters long, the limit is %d", ErrInvalid, len(key), MaxLen)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == ',' {
			return fmt.Errorf("%w: character %d (%s) is not allowed; use printable ASCII without spaces, '\"' or ','", ErrInvalid, i+1, describeByte(c))
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
				return "", fmt.Errorf("%w: bad escape in quoted key", ErrInvalid)
			}
			buf = append(buf, v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: data after the closing quote (lists are not accepted)", ErrInvalid)
			}
			return string(buf), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: character %d (%s) is not allowed", ErrInvalid, i+1, describeByte(c))
		default:
			buf = append(buf, c)
		}
	}
	return "", fmt.Errorf("%w: the quoted key has no closing quote", ErrInvalid)
}

func describeByte(c byte) string {
	if c >= 0x21 && c <= 0x7e {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02X", c)
}

// Hash is a short, non-reversible handle on (tenant, key) for logs, so an
// operation can be correlated without logging the key itself.
func Hash(tenant, key string) string {
	// One buffer on the stack for tenant, NUL and key (a key is at most
	// MaxLen bytes), hashed at once: a digest and its Sum allocated per
	// request, which every write logs (issue 29).
	var buf [64 + 1 + MaxLen]byte
	b := append(append(append(buf[:0], tenant...), 0), key...)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}
