package notes

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quillhq/quill/internal/outbox"
)

// Ids are derived from the operation, not drawn at random (decision 0050):
// an operation executed again after the database was restored from an older
// backup must produce the note, attachment and events it produced before,
// so that JetStream's duplicate window and every consumer's inbox recognise
// its events by id and no second, different note.created exists for one
// intent.
//
// The note id is keyed: an HMAC-SHA256, under the database's own secret, of
// the tenant, the operation key and a generation. Without the key anyone
// who saw a note id could test guesses of the operation key behind it
// (keys are chosen by tenants and often guessable), and a tenant could
// predict another's ids. Everything else is derived from the note id, which
// is already unguessable, with plain SHA-256: the worker can derive the
// attachment.processed id without the secret.

// idSecretLen is the secret's length in bytes (migration 00009).
const idSecretLen = 32

// maxGenerations bounds how many times one key may have been used for a new
// intent, each after the previous use was forgotten (QUILL_KEY_RETENTION):
// the generation is the number of earlier notes of (tenant, key), found by
// the primary key refusing each earlier id in turn.
const maxGenerations = 16

// ErrKeyGenerations is returned by a create whose key already has
// maxGenerations notes, one per earlier intent that used it.
var ErrKeyGenerations = errors.New("the operation key was used for too many intents, each after it was forgotten")

// Domain-separation labels: no two derivations hash the same bytes.
const (
	labelNote       = "quill/note-id/v1"
	labelAttachment = "quill/attachment-id/v1"
	labelNoteEvent  = "quill/note-event-id/v2"
	labelProcessed  = "quill/attachment-processed-id/v1"
)

// NoteID returns the id of the note that the create-note operation (tenant,
// key) creates in its generation-th use of the key (0 for the first), under
// the database's id secret. Each part is length-prefixed, so tenant "a",
// key "bc" and tenant "ab", key "c" hash different bytes.
func NoteID(secret []byte, tenant, key string, generation int) uuid.UUID {
	var buf [256]byte
	msg := appendPart(buf[:0], labelNote)
	msg = appendPart(msg, tenant)
	msg = appendPart(msg, key)
	msg = appendIntPart(msg, generation)
	sum := hmacSHA256(secret, msg)
	return v8(sum[:])
}

// AttachmentID returns the id of note's attachment (a note has at most one).
func AttachmentID(note uuid.UUID) uuid.UUID {
	var buf [96]byte
	return hashed(appendUUIDPart(appendPart(buf[:0], labelAttachment), note))
}

// NoteEventID returns the id of the note event that the operation with key
// writes about note at version, the note's version after the change
// (SPEC §5: note.created 1, each note.updated its new version, note.deleted
// the last plus one). A note has one event per version, so (note, version)
// alone would be unique; the key is hashed too so that, after a restore
// from an older backup, another operation that reaches the same version
// writes an event of its own rather than one that every consumer's inbox
// and JetStream's duplicate window take for the lost one (decision 0078).
// The same operation executed again writes the same id.
func NoteEventID(note uuid.UUID, version int, key string) uuid.UUID {
	var buf [256]byte
	msg := appendUUIDPart(appendPart(buf[:0], labelNoteEvent), note)
	msg = appendIntPart(msg, version)
	return hashed(appendPart(msg, key))
}

// ProcessedEventID returns the id of the attachment.processed event that
// the worker writes for the note.created event noteCreated: a worker that
// processes a note.created again (its inbox restored from an older backup,
// say) writes an event that every consumer recognises as the one before.
func ProcessedEventID(noteCreated uuid.UUID) uuid.UUID {
	var buf [96]byte
	return hashed(appendUUIDPart(appendPart(buf[:0], labelProcessed), noteCreated))
}

// hashed is the v8 UUID of the SHA-256 of msg.
func hashed(msg []byte) uuid.UUID {
	sum := sha256.Sum256(msg)
	return v8(sum[:])
}

// The derivations hash one message of length-prefixed parts, so that no
// two lists of parts give the same bytes. It is built in a buffer on the
// caller's stack: writing each part to a hash.Hash through its interface
// copied every part to the heap, and the UUIDs' and numbers' text with it
// (issue 29).

// appendPart appends p after its length.
func appendPart(dst []byte, p string) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(p)))
	return append(dst, p...)
}

// appendIntPart appends n's decimal text as a part.
func appendIntPart(dst []byte, n int) []byte {
	dst = binary.BigEndian.AppendUint32(dst, 0)
	at := len(dst)
	dst = strconv.AppendInt(dst, int64(n), 10)
	binary.BigEndian.PutUint32(dst[at-4:], uint32(len(dst)-at))
	return dst
}

// appendUUIDPart appends u's canonical text form as a part.
func appendUUIDPart(dst []byte, u uuid.UUID) []byte {
	return outbox.AppendUUID(binary.BigEndian.AppendUint32(dst, 36), u)
}

// hmacSHA256 is HMAC-SHA256 (RFC 2104) of msg under key, built on
// sha256.Sum256 over buffers on the stack: crypto/hmac's New allocates two
// hash states per call, five allocations of every create.
// TestHMACSHA256 holds it to crypto/hmac.
func hmacSHA256(key, msg []byte) [sha256.Size]byte {
	const block = 64
	var hashedKey [sha256.Size]byte
	if len(key) > block {
		hashedKey = sha256.Sum256(key) // RFC 2104: a long key is hashed first
		key = hashedKey[:]
	}
	var inner [block + 256]byte
	var outer [block + sha256.Size]byte
	for i := range block {
		k := byte(0)
		if i < len(key) {
			k = key[i]
		}
		inner[i], outer[i] = k^0x36, k^0x5c
	}
	isum := sha256.Sum256(append(inner[:block], msg...))
	copy(outer[block:], isum[:])
	return sha256.Sum256(outer[:])
}

// v8 makes an RFC 9562 version-8 (custom) UUID of the first 16 bytes of
// sum: 122 bits of the hash, the version and the variant.
func v8(sum []byte) uuid.UUID {
	var u uuid.UUID
	copy(u[:], sum[:16])
	u[6] = u[6]&0x0f | 0x80
	u[8] = u[8]&0x3f | 0x80
	return u
}

// idSecret is the database's id secret, read once per service.
type idSecret struct {
	mu  sync.Mutex
	key []byte
}

const sqlIDSecretGet = `SELECT secret FROM id_secret`

// get returns the secret, reading it from the database the first time. A
// failed read is not remembered: the next write reads again.
func (s *idSecret) get(ctx context.Context, pool *pgxpool.Pool) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil {
		return s.key, nil
	}
	var key []byte
	if err := pool.QueryRow(ctx, sqlIDSecretGet).Scan(&key); err != nil {
		return nil, fmt.Errorf("read id secret: %w", err)
	}
	if len(key) != idSecretLen {
		return nil, fmt.Errorf("read id secret: %d bytes, want %d", len(key), idSecretLen)
	}
	s.key = key
	return key, nil
}
