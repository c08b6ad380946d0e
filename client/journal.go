package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
)

// Settlement states: the final outcome of a journalled operation.
const (
	// StateCompleted: the server executed the operation (or had).
	StateCompleted = "completed"
	// StateRefused: the server's answer is final and not a success.
	StateRefused = "refused"
)

// JournalEntry is one journalled operation: what is needed to send it again
// under its original key, and its outcome once settled.
type JournalEntry struct {
	// Key is the operation key.
	Key string `json:"key"`
	// Action is one of contract.Actions.
	Action string `json:"action"`
	// Params are the write's parameters: a NewNote for create-note;
	// {"id", "if_version", "title"?, "body"?} for update-note (a member
	// absent is a field the update keeps); {"id"} for delete-note, with
	// "if_version" when it was sent with If-Match; a NewWebhook for
	// create-webhook; {"id"} for delete-webhook and rotate-webhook-secret.
	Params json.RawMessage `json:"params"`
	// CreatedAt is when the operation was first journalled, just before
	// its first send: the key's age counts from it.
	CreatedAt time.Time `json:"created_at"`
	// Settled is the final outcome; nil while the operation is unsettled.
	Settled *Settlement `json:"settled,omitempty"`
}

// Settlement is a journalled operation's final outcome.
type Settlement struct {
	// State is StateCompleted or StateRefused.
	State string `json:"state"`
	// Status is the HTTP status of the answer.
	Status int `json:"status"`
	// Body is the answer's body (the note, the endpoint, the delete
	// response or the problem), except a webhook secret: a create's or
	// rotation's is kept with "secret": null, as the lookup shows it.
	Body json.RawMessage `json:"body,omitempty"`
	// At is when it was settled.
	At time.Time `json:"at"`
}

// Journal records operations durably so that a restarted process finishes
// them under their original keys. Implementations must be safe for
// concurrent use.
type Journal interface {
	// Begin records e before its first send and returns the entry as
	// recorded. When e.Key is recorded already, the recorded CreatedAt
	// is kept (the key's age counts from its first send) and the entry
	// becomes unsettled again with e's parameters.
	Begin(ctx context.Context, e JournalEntry) (JournalEntry, error)
	// Settle records key's final outcome. It returns ErrNotJournalled
	// for a key never begun.
	Settle(ctx context.Context, key string, s Settlement) error
	// Unsettled returns the operations begun and not settled, oldest
	// first. Records it cannot read are reported in the error (wrapping
	// ErrCorruptRecord) while the readable ones are still returned.
	Unsettled(ctx context.Context) ([]JournalEntry, error)
	// Get returns key's entry, or ErrNotJournalled.
	Get(ctx context.Context, key string) (JournalEntry, error)
}

// ErrNotJournalled is returned for a key the journal has no record of.
var ErrNotJournalled = errors.New("operation is not in the journal")

// ErrCorruptRecord is wrapped by errors about journal records that fail
// their checksum or do not parse.
var ErrCorruptRecord = errors.New("corrupt journal record")

// recordMagic starts every journal record.
const recordMagic = "quill-journal-v1"

// maxRecordBytes bounds a record: a 1 MiB attachment in base64 and a
// 64 KiB body fit with room to spare.
const maxRecordBytes = 8 << 20

// FileJournal is a Journal in a directory, one file per operation. Each
// write goes to a temporary file that is fsynced, renamed over the
// operation's file and followed by an fsync of the directory, so a crash
// leaves either the old record or the new one, never a torn one; each
// record also carries its length and SHA-256, so a damaged file is reported
// rather than trusted.
//
// Unsettled operations live in the directory itself and settled ones in
// its subdirectory settled/, so that Unsettled — which every MCP
// create_note without a key calls — reads only the unsettled records,
// however many operations were settled (decision 0067). Settle writes the
// settled record there and then removes the unsettled one; where both
// exist (a crash between the two steps), the unsettled one is the record,
// as if Settle had not happened. Prune moves aside the settled records that
// a journal written by an earlier version keeps beside the unsettled ones.
//
// Every change (Begin, Settle, Prune) is a read-modify-write done under an
// exclusive flock(2) of the file .lock in the directory, taken anew for each
// change, so concurrent quill processes (and goroutines) over one journal
// never overwrite each other's records; a change waits for the lock up to
// LockWait, then fails naming the journal (decision 0043). Reads take no
// lock: a rename is atomic.
type FileJournal struct {
	dir string
	// LockWait bounds the wait for the lock. Default DefaultLockWait.
	LockWait time.Duration
}

// DefaultLockWait is how long a change waits for another process's change
// to the same journal; changes take milliseconds, so reaching it means a
// process holds the lock and is stuck.
const DefaultLockWait = 10 * time.Second

// staleTempAge is how old a temporary file must be for OpenFileJournal to
// remove it. Under the lock no writer of this version is mid-write, so
// any temporary file is a crashed write's; the age spares a live writer of
// a version that took no lock.
const staleTempAge = time.Minute

// lockFile is the lock's name in the journal's directory.
const lockFile = ".lock"

// tempPattern names temporary files (os.CreateTemp).
const tempPattern = ".tmp-*"

// errLockBusy: another holder has the lock.
var errLockBusy = errors.New("journal lock is held")

// ErrJournalLocked is returned when a change waited LockWait for another
// process's lock on the journal.
var ErrJournalLocked = errors.New("journal is locked by another process")

var _ Journal = (*FileJournal)(nil)

// OpenFileJournal returns the journal in dir, creating the directory (mode
// 0700: records hold note titles and bodies) when missing.
func OpenFileJournal(dir string) (*FileJournal, error) {
	if dir == "" {
		return nil, errors.New("journal directory is empty")
	}
	if err := os.MkdirAll(filepath.Join(dir, settledDir), 0o700); err != nil {
		return nil, fmt.Errorf("create journal directory: %w", err)
	}
	j := &FileJournal{dir: dir, LockWait: DefaultLockWait}
	j.removeStaleTemps(time.Now())
	return j, nil
}

// removeStaleTemps removes the temporary files of crashed writes older
// than staleTempAge, under the lock, when it is free at once: a busy lock
// means another process is working, and the next open cleans up. It is
// best effort; a failure only leaves files that Unsettled ignores.
func (j *FileJournal) removeStaleTemps(now time.Time) {
	f, err := j.openLock()
	if err != nil {
		return
	}
	defer f.Close() // releases the lock
	if tryLock(f) != nil {
		return
	}
	for _, dir := range []string{j.dir, filepath.Join(j.dir, settledDir)} {
		temps, _ := filepath.Glob(filepath.Join(dir, tempPattern))
		removed := false
		for _, p := range temps {
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && now.Sub(fi.ModTime()) >= staleTempAge {
				removed = os.Remove(p) == nil || removed
			}
		}
		if removed {
			_ = syncDir(dir)
		}
	}
}

func (j *FileJournal) openLock() (*os.File, error) {
	return os.OpenFile(filepath.Join(j.dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
}

// lock takes the journal's exclusive lock, waiting up to LockWait (or
// until ctx ends); the returned function releases it. Each call opens the
// lock file anew: flock belongs to the open file, so two goroutines of one
// process exclude each other as two processes do.
func (j *FileJournal) lock(ctx context.Context) (func(), error) {
	f, err := j.openLock()
	if err != nil {
		return nil, fmt.Errorf("journal lock: %w", err)
	}
	patience := j.LockWait
	if patience <= 0 {
		patience = DefaultLockWait
	}
	deadline := time.Now().Add(patience)
	delay := time.Millisecond
	for {
		err := tryLock(f)
		if err == nil {
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, errLockBusy) {
			_ = f.Close()
			return nil, fmt.Errorf("journal lock: %w", err)
		}
		if time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("%w: %s has been locked for %s; is another quill stuck? (the lock is %s)",
				ErrJournalLocked, j.dir, patience, filepath.Join(j.dir, lockFile))
		}
		if !sleep(ctx, delay) {
			_ = f.Close()
			return nil, fmt.Errorf("journal lock: %w", ctx.Err())
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// Dir returns the journal's directory.
func (j *FileJournal) Dir() string { return j.dir }

func (j *FileJournal) path(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(j.dir, hex.EncodeToString(sum[:16])+".op")
}

// settledDir is the subdirectory of settled records.
const settledDir = "settled"

// settledPath is where key's record lives once settled.
func (j *FileJournal) settledPath(key string) string {
	return filepath.Join(j.dir, settledDir, filepath.Base(j.path(key)))
}

// current reads key's record: the unsettled one when there is one, else
// the settled one. It returns an error wrapping fs.ErrNotExist when there
// is neither.
func (j *FileJournal) current(key string) (JournalEntry, error) {
	e, err := j.read(j.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return j.read(j.settledPath(key))
	}
	return e, err
}

// Begin implements Journal.
func (j *FileJournal) Begin(ctx context.Context, e JournalEntry) (JournalEntry, error) {
	if err := checkEntry(e); err != nil {
		return JournalEntry{}, err
	}
	unlock, err := j.lock(ctx)
	if err != nil {
		return JournalEntry{}, err
	}
	defer unlock()
	if old, err := j.current(e.Key); err == nil && old.Key == e.Key && !old.CreatedAt.IsZero() {
		e.CreatedAt = old.CreatedAt
	}
	e.Settled = nil
	if err := j.write(j.dir, j.path(e.Key), e); err != nil {
		return JournalEntry{}, err
	}
	// The unsettled record now wins over a settled one of the key; the
	// settled one is removed only for tidiness, so no fsync is owed.
	_ = os.Remove(j.settledPath(e.Key))
	return e, nil
}

// Settle implements Journal: the settled record is written (fsynced) into
// settled/ before the unsettled one is removed (and that removal fsynced),
// so a crash between the two leaves the operation unsettled, never lost.
func (j *FileJournal) Settle(ctx context.Context, key string, s Settlement) error {
	unlock, err := j.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	e, err := j.current(key)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %q", ErrNotJournalled, key)
	}
	if err != nil {
		return err
	}
	e.Settled = &s
	if err := j.write(filepath.Join(j.dir, settledDir), j.settledPath(key), e); err != nil {
		return err
	}
	if err := os.Remove(j.path(key)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // settled already: its settled record was rewritten
		}
		return fmt.Errorf("journal: %w", err)
	}
	return syncDir(j.dir)
}

// Get implements Journal.
func (j *FileJournal) Get(_ context.Context, key string) (JournalEntry, error) {
	e, err := j.current(key)
	if errors.Is(err, fs.ErrNotExist) {
		return JournalEntry{}, fmt.Errorf("%w: %q", ErrNotJournalled, key)
	}
	if err == nil && e.Key != key {
		return JournalEntry{}, fmt.Errorf("%w: %q", ErrNotJournalled, key)
	}
	return e, err
}

// Unsettled implements Journal. It reads the journal's directory alone,
// never settled/, so its cost follows the number of unsettled operations.
// Temporary files left by a crash mid-write are ignored (their rename
// never happened, so the previous record stands).
func (j *FileJournal) Unsettled(_ context.Context) ([]JournalEntry, error) {
	des, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	var (
		out  []JournalEntry
		errs []error
	)
	for _, de := range des {
		if de.IsDir() || !strings.HasSuffix(de.Name(), ".op") {
			continue
		}
		e, err := j.read(filepath.Join(j.dir, de.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if e.Settled == nil {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].CreatedAt.Before(out[b].CreatedAt) })
	return out, errors.Join(errs...)
}

// PruneResult says what Prune found and did, by operation key.
type PruneResult struct {
	// Removed are settled operations whose records were removed.
	Removed []string `json:"removed"`
	// Abandoned are unsettled operations past the key retention whose
	// records were removed (abandon).
	Abandoned []string `json:"abandoned"`
	// Expired are unsettled operations past the key retention that were
	// kept: their keys are never sent again (ErrKeyTooOld) and the server
	// may have forgotten them, so their outcome may stay unknown.
	Expired []JournalEntry `json:"expired"`
}

// Prune removes the records of operations settled before settledBefore.
// Unsettled operations first sent before expiredBefore (now − the key
// retention) are listed in Expired, or removed when abandon is true — the
// caller's explicit decision to stop tracking an outcome that may never be
// known. Settled records it keeps that lie beside the unsettled ones (a
// journal of an earlier version) are moved into settled/. Records that
// cannot be read are kept and reported in the error.
//
// A settled record whose file was written at or after settledBefore is
// not read: it was settled since (Settle writes it then), so the pass
// costs a directory listing plus the records it removes. The lock is
// taken for pruneBatch records at a time, so that the writes of other
// calls and processes wait for one batch at most, not for the whole pass.
func (j *FileJournal) Prune(ctx context.Context, settledBefore, expiredBefore time.Time, abandon bool) (PruneResult, error) {
	res := PruneResult{Removed: []string{}, Abandoned: []string{}, Expired: []JournalEntry{}}
	var errs []error
	for _, dir := range []string{j.dir, filepath.Join(j.dir, settledDir)} {
		des, err := os.ReadDir(dir)
		if err != nil {
			return res, errors.Join(append(errs, fmt.Errorf("read journal: %w", err))...)
		}
		var names []string
		for _, de := range des {
			if de.IsDir() || !strings.HasSuffix(de.Name(), ".op") {
				continue
			}
			if dir != j.dir {
				if fi, err := de.Info(); err == nil && !fi.ModTime().Before(settledBefore) {
					continue
				}
			}
			names = append(names, de.Name())
		}
		for len(names) > 0 {
			n := min(len(names), pruneBatch)
			if err := j.pruneBatch(ctx, dir, names[:n], settledBefore, expiredBefore, abandon, &res, &errs); err != nil {
				return res, errors.Join(append(errs, err)...)
			}
			names = names[n:]
		}
	}
	sort.Strings(res.Removed)
	sort.Strings(res.Abandoned)
	sort.SliceStable(res.Expired, func(a, b int) bool { return res.Expired[a].CreatedAt.Before(res.Expired[b].CreatedAt) })
	return res, errors.Join(errs...)
}

// pruneBatch is the number of records Prune handles under one taking of
// the lock.
const pruneBatch = 64

// pruneBatch prunes the named records of dir (the journal's directory or
// settled/) under the lock, reading each anew: it may have changed since
// the listing. Unreadable records are appended to errs; the error is one
// that stops the pass (the lock, a removal that fails).
func (j *FileJournal) pruneBatch(ctx context.Context, dir string, names []string, settledBefore, expiredBefore time.Time,
	abandon bool, res *PruneResult, errs *[]error) error {
	unlock, err := j.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	top, settled := j.dir, filepath.Join(j.dir, settledDir)
	changed := map[string]bool{}
	for _, name := range names {
		path := filepath.Join(dir, name)
		e, err := j.read(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // settled or removed since the listing
		}
		if err != nil {
			*errs = append(*errs, err)
			continue
		}
		remove := false
		switch {
		case e.Settled != nil && e.Settled.At.Before(settledBefore):
			res.Removed, remove = append(res.Removed, e.Key), true
		case e.Settled != nil && dir == top:
			// Kept, but not where every call reads: a rename replaces
			// any settled copy, which the unsettled path outranked.
			if err := os.Rename(path, filepath.Join(settled, name)); err != nil {
				return fmt.Errorf("prune journal: %w", err)
			}
			changed[top], changed[settled] = true, true
		case e.Settled != nil:
		case dir != top:
			// An unsettled record in settled/ is none of Settle's; the
			// journal does not read it, and prune leaves it alone.
		case e.CreatedAt.Before(expiredBefore) && abandon:
			res.Abandoned, remove = append(res.Abandoned, e.Key), true
		case e.CreatedAt.Before(expiredBefore):
			res.Expired = append(res.Expired, e)
		}
		if !remove {
			continue
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("prune journal: %w", err)
		}
		changed[dir] = true
		if dir == top {
			// A settled copy beside a removed record must not come back
			// as its record.
			if os.Remove(filepath.Join(settled, name)) == nil {
				changed[settled] = true
			}
		}
	}
	for _, d := range []string{settled, top} {
		if changed[d] {
			if err := syncDir(d); err != nil {
				*errs = append(*errs, err)
			}
		}
	}
	return nil
}

func (j *FileJournal) read(path string) (JournalEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return JournalEntry{}, err
	}
	e, err := ParseRecord(b)
	if err != nil {
		return JournalEntry{}, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}

// write replaces e's record at path, in dir, atomically and durably.
func (j *FileJournal) write(dir, path string, e JournalEntry) error {
	rec, err := MarshalRecord(e)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tempPattern)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(rec); err != nil {
		return fmt.Errorf("journal write: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("journal fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("journal close: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("journal rename: %w", err)
	}
	ok = true
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("journal fsync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("journal fsync directory: %w", err)
	}
	return nil
}

func checkEntry(e JournalEntry) error {
	if _, err := opkey.Parse(e.Key); err != nil || strings.HasPrefix(e.Key, `"`) {
		return fmt.Errorf("journal entry: bad key %q", e.Key)
	}
	if !slices.Contains(contract.Actions(), e.Action) {
		return fmt.Errorf("journal entry: unknown action %q", e.Action)
	}
	if !json.Valid(e.Params) {
		return errors.New("journal entry: params are not JSON")
	}
	if e.CreatedAt.IsZero() {
		return errors.New("journal entry: created_at is missing")
	}
	return nil
}

// MarshalRecord encodes e as a journal record: a header line
// "quill-journal-v1 <length> <sha256 hex>" and the entry's JSON.
func MarshalRecord(e JournalEntry) ([]byte, error) {
	if err := checkEntry(e); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("journal entry: %w", err)
	}
	sum := sha256.Sum256(payload)
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %d %s\n", recordMagic, len(payload), hex.EncodeToString(sum[:]))
	b.Write(payload)
	return b.Bytes(), nil
}

// ParseRecord decodes a record written by MarshalRecord. A truncated,
// extended or altered record is an error wrapping ErrCorruptRecord.
func ParseRecord(b []byte) (JournalEntry, error) {
	bad := func(why string) (JournalEntry, error) {
		return JournalEntry{}, fmt.Errorf("%w: %s", ErrCorruptRecord, why)
	}
	if len(b) > maxRecordBytes {
		return bad("too large")
	}
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		return bad("no header line")
	}
	f := strings.Split(string(b[:nl]), " ")
	if len(f) != 3 || f[0] != recordMagic {
		return bad("bad header")
	}
	n, err := strconv.Atoi(f[1])
	payload := b[nl+1:]
	if err != nil || n < 0 || strconv.Itoa(n) != f[1] || n != len(payload) {
		return bad(fmt.Sprintf("length %q does not match the %d bytes present", f[1], len(payload)))
	}
	sum := sha256.Sum256(payload)
	if want := hex.EncodeToString(sum[:]); f[2] != want {
		return bad("checksum mismatch")
	}
	var e JournalEntry
	if err := json.Unmarshal(payload, &e); err != nil {
		return bad(err.Error())
	}
	if err := checkEntry(e); err != nil {
		return bad(err.Error())
	}
	if e.Settled != nil && e.Settled.State != StateCompleted && e.Settled.State != StateRefused {
		return bad(fmt.Sprintf("unknown settlement state %q", e.Settled.State))
	}
	return e, nil
}
