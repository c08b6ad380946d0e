package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
)

// sessionKey is a row of console_session_keys (migration 00012): the
// newest signs new sessions; an older one verifies the sessions it signed
// until they expire.
type sessionKey struct {
	id        int32
	secret    []byte
	createdAt time.Time
	// supersededAt is the next key's creation, zero for the newest.
	supersededAt time.Time
}

const (
	sqlKeysLoad = `SELECT id, secret, created_at FROM console_session_keys ORDER BY id`
	// sqlKeyRotate adds a key ($1 secret, $2 now) and drops the keys that
	// can verify no session any more: those superseded before $4 (now less
	// the longest a session signed with them can last), or with $3 every
	// older one. The DELETE sees the table as it was before the INSERT, so
	// the key just superseded is dropped only with $3.
	sqlKeyRotate = `WITH k AS (
		INSERT INTO console_session_keys (secret, created_at) VALUES ($1, $2) RETURNING id
	), gone AS (
		DELETE FROM console_session_keys o
		WHERE $3 OR (SELECT min(n.created_at) FROM console_session_keys n WHERE n.id > o.id) < $4
		RETURNING o.id
	)
	SELECT (SELECT id FROM k), (SELECT count(*) FROM gone)`
)

// ErrNoSessionKey: console_session_keys is empty (migration 00012 makes the
// first key; "api console rotate-key" makes another).
var ErrNoSessionKey = errors.New(`the console has no session key: run "api console rotate-key"`)

// Rotation is what RotateSessionKey did.
type Rotation struct {
	// ID is the new key's, which signs every new session from now on (on
	// a running API within its ValidityTTL, when it reads the keys again).
	ID int32
	// Dropped is the older keys removed.
	Dropped int64
}

// RotateSessionKey makes a new session key (256 random bits) at now. The
// previous key still verifies its sessions until they expire (12 hours);
// keys that can verify no unexpired session are dropped. With endSessions
// every older key is dropped, so every session ends — on a running API
// within its ValidityTTL (30 s). Errors: database errors.
func RotateSessionKey(ctx context.Context, q idempotency.Querier, now time.Time, endSessions bool) (Rotation, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return Rotation{}, fmt.Errorf("random session key: %w", err)
	}
	var r Rotation
	err := q.QueryRow(ctx, sqlKeyRotate, secret, now, endSessions, now.Add(-keyLifetime(DefaultSessionTTL, DefaultValidityTTL))).Scan(&r.ID, &r.Dropped)
	if err != nil {
		return Rotation{}, fmt.Errorf("rotate the console session key: %w", db.Translate(err))
	}
	return r, nil
}

// keyLifetime is how long after it is superseded a key still verifies: a
// session it signed lasts sessionTTL, and an API that has not yet read the
// new key signs with it for up to refresh more.
func keyLifetime(sessionTTL, refresh time.Duration) time.Duration { return sessionTTL + refresh }

// keyRetryInterval bounds how often a cookie naming a key this process has
// not read makes it read the keys again (a rotation elsewhere), so that
// invented key ids cost at most one query a second.
const keyRetryInterval = time.Second

// keys returns the session keys, oldest first, read again when they were
// read more than ValidityTTL ago, or when want (a key id; 0 for none) is
// not among them and they were read more than keyRetryInterval ago.
// Errors: ErrNoSessionKey, database errors.
func (c *Console) keys(ctx context.Context, want int32) ([]sessionKey, error) {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	now := c.cfg.Now()
	age := now.Sub(c.keysRead)
	fresh := c.keyring != nil && age >= 0 && age < c.cfg.ValidityTTL
	if fresh && (want == 0 || hasKey(c.keyring, want) || age < keyRetryInterval) {
		return c.keyring, nil
	}
	rows, err := c.pool.Query(ctx, sqlKeysLoad)
	if err != nil {
		return nil, fmt.Errorf("read the console session keys: %w", db.Translate(err))
	}
	defer rows.Close()
	var ks []sessionKey
	for rows.Next() {
		var k sessionKey
		if err := rows.Scan(&k.id, &k.secret, &k.createdAt); err != nil {
			return nil, fmt.Errorf("read the console session keys: %w", db.Translate(err))
		}
		if n := len(ks); n > 0 {
			ks[n-1].supersededAt = k.createdAt
		}
		ks = append(ks, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the console session keys: %w", db.Translate(err))
	}
	if len(ks) == 0 {
		return nil, ErrNoSessionKey
	}
	c.keyring, c.keysRead = ks, now
	return ks, nil
}

func hasKey(ks []sessionKey, id int32) bool {
	for _, k := range ks {
		if k.id == id {
			return true
		}
	}
	return false
}

// verifier returns the key with id when it may still verify sessions at
// now: the newest, or an older one within its lifetime.
func (c *Console) verifier(ks []sessionKey, id int32, now time.Time) ([]byte, bool) {
	for _, k := range ks {
		if k.id != id {
			continue
		}
		if !k.supersededAt.IsZero() && !now.Before(k.supersededAt.Add(keyLifetime(c.cfg.SessionTTL, c.cfg.ValidityTTL))) {
			return nil, false
		}
		return k.secret, true
	}
	return nil, false
}

// mac is the HMAC-SHA256 under key of parts, each followed by a zero byte.
func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}
