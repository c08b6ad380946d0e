// Package whsecret makes, seals and signs with webhook endpoints' secrets
// (SPEC §11).
//
// A secret has the Standard Webhooks form "whsec_" + base64(32 random
// bytes). It is shown to the tenant once and stored only sealed: AES-256-GCM
// under a key from the environment (QUILL_WEBHOOK_SECRET_KEY), with the
// endpoint's tenant and id as additional data, so that a reader of the
// database cannot sign and a sealed secret copied onto another endpoint's
// row does not open. Several keys may be configured: the first seals, each
// opens what it sealed (a sealed value names its key by a short id), so the
// key can be rotated without re-sealing every row at once.
//
// Signatures follow the Standard Webhooks specification: "v1," +
// base64(HMAC-SHA256(secret bytes, id + "." + timestamp + "." + body)),
// several space-separated while two secrets sign (a rotation).
package whsecret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Prefix begins every secret.
const Prefix = "whsec_"

// secretBytes is the size of a new secret: the Standard Webhooks
// specification asks for 24 to 64 bytes.
const secretBytes = 32

// KeyEnv names the setting that holds the sealing keys.
const KeyEnv = "QUILL_WEBHOOK_SECRET_KEY"

// sealVersion is the first byte of a sealed value.
const sealVersion = 1

// keyIDLen is the length of the key id in a sealed value.
const keyIDLen = 4

// ErrNoKey is returned by ParseKeys for an empty setting.
var ErrNoKey = errors.New(KeyEnv + " is not set: webhook secrets cannot be sealed or opened (make one with: openssl rand -base64 32)")

// ErrOpen is returned by Open for a sealed value that no configured key
// opens, or that was sealed for another endpoint.
var ErrOpen = errors.New("webhook secret does not open with the configured keys (another " + KeyEnv + ", or another endpoint's row)")

// Keys seal and open secrets. The zero value has no key; use ParseKeys.
type Keys struct {
	seal key
	byID map[[keyIDLen]byte]cipher.AEAD
}

type key struct {
	id   [keyIDLen]byte
	aead cipher.AEAD
}

// ParseKeys reads a comma-separated list of base64 (standard encoding)
// 32-byte keys, the first of which seals. It returns ErrNoKey for an empty
// list, or an error naming the setting and the position of a key that is
// not base64 of 32 bytes.
func ParseKeys(s string) (*Keys, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, ErrNoKey
	}
	ks := &Keys{byID: map[[keyIDLen]byte]cipher.AEAD{}}
	for i, part := range strings.Split(s, ",") {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(part))
		if err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("%s: key %d is not the base64 of 32 bytes (make one with: openssl rand -base64 32)", KeyEnv, i+1)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: key %d: %w", KeyEnv, i+1, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("%s: key %d: %w", KeyEnv, i+1, err)
		}
		sum := sha256.Sum256(raw)
		var id [keyIDLen]byte
		copy(id[:], sum[:])
		if _, dup := ks.byID[id]; dup {
			return nil, fmt.Errorf("%s: key %d is given twice", KeyEnv, i+1)
		}
		ks.byID[id] = aead
		if i == 0 {
			ks.seal = key{id: id, aead: aead}
		}
	}
	return ks, nil
}

// additional binds a sealed secret to its endpoint.
func additional(tenant, endpointID string) []byte {
	return []byte("quill/webhook-secret/v1\x00" + tenant + "\x00" + endpointID)
}

// Seal returns secret sealed for the endpoint endpointID of tenant. It
// returns an error only when the system's random source fails.
func (k *Keys) Seal(secret, tenant, endpointID string) ([]byte, error) {
	if k == nil || k.seal.aead == nil {
		return nil, ErrNoKey
	}
	nonce := make([]byte, k.seal.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal webhook secret: %w", err)
	}
	out := make([]byte, 0, 1+keyIDLen+len(nonce)+len(secret)+k.seal.aead.Overhead())
	out = append(out, sealVersion)
	out = append(out, k.seal.id[:]...)
	out = append(out, nonce...)
	return k.seal.aead.Seal(out, nonce, []byte(secret), additional(tenant, endpointID)), nil
}

// Open returns the secret that Seal sealed for the same tenant and
// endpoint. It returns ErrOpen when no configured key opens it.
func (k *Keys) Open(sealed []byte, tenant, endpointID string) (string, error) {
	if k == nil || k.byID == nil {
		return "", ErrNoKey
	}
	if len(sealed) < 1+keyIDLen || sealed[0] != sealVersion {
		return "", ErrOpen
	}
	var id [keyIDLen]byte
	copy(id[:], sealed[1:1+keyIDLen])
	aead, ok := k.byID[id]
	if !ok {
		return "", ErrOpen
	}
	rest := sealed[1+keyIDLen:]
	if len(rest) < aead.NonceSize() {
		return "", ErrOpen
	}
	plain, err := aead.Open(nil, rest[:aead.NonceSize()], rest[aead.NonceSize():], additional(tenant, endpointID))
	if err != nil {
		return "", ErrOpen
	}
	return string(plain), nil
}

// NewSecret returns a new secret, "whsec_" + base64 of 32 random bytes. It
// returns an error only when the system's random source fails.
func NewSecret() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("new webhook secret: %w", err)
	}
	return Prefix + base64.StdEncoding.EncodeToString(b), nil
}

// secretKey is the HMAC key of a secret: the bytes its base64 names (the
// Standard Webhooks libraries accept the secret with or without the
// prefix).
func secretKey(secret string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, Prefix))
	if err != nil || len(b) == 0 {
		return nil, errors.New("webhook secret is not whsec_ followed by base64")
	}
	return b, nil
}

// Sign returns the webhook-signature header for a message id, a timestamp
// (Unix seconds) and a body, signed with each secret (the current one
// first): "v1,<sig>" per secret, space-separated. It returns an error for no
// secret or one that is not of the whsec_ form.
func Sign(secrets []string, id string, timestamp int64, body []byte) (string, error) {
	if len(secrets) == 0 {
		return "", errors.New("sign webhook: no secret")
	}
	var sb strings.Builder
	for i, s := range secrets {
		k, err := secretKey(s)
		if err != nil {
			return "", fmt.Errorf("sign webhook: %w", err)
		}
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString("v1,")
		sb.WriteString(base64.StdEncoding.EncodeToString(mac(k, id, timestamp, body)))
	}
	return sb.String(), nil
}

func mac(k []byte, id string, timestamp int64, body []byte) []byte {
	h := hmac.New(sha256.New, k)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write(strconv.AppendInt(nil, timestamp, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify reports whether header (a webhook-signature value) holds a v1
// signature of id, timestamp and body by secret. It does not check the
// timestamp's age; a receiver must (the Standard Webhooks libraries allow
// five minutes). It returns an error for a secret not of the whsec_ form.
func Verify(secret, header, id string, timestamp int64, body []byte) (bool, error) {
	k, err := secretKey(secret)
	if err != nil {
		return false, fmt.Errorf("verify webhook: %w", err)
	}
	want := mac(k, id, timestamp, body)
	for _, sig := range strings.Fields(header) {
		v, enc, ok := strings.Cut(sig, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(enc)
		if err == nil && subtle.ConstantTimeCompare(got, want) == 1 {
			return true, nil
		}
	}
	return false, nil
}
