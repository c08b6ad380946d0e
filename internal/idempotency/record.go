package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/quillhq/quill/internal/db"
)

// Record is the committed outcome of one operation: what was asked (action,
// version, fingerprint), what it produced (resource, response) and its
// lifetime. A compacted record (a tombstone) has no response body.
type Record struct {
	Tenant      string
	Key         string
	Action      string
	Version     int
	Fingerprint []byte
	// Fields are the parameters' hashes as read from the database;
	// a record this process made keeps them as fieldsJSON alone (see
	// fieldHashes).
	Fields map[string]string
	// fieldsJSON is the hashes as JSON when the fingerprint built them;
	// appendRecordArgs builds it from Fields otherwise.
	fieldsJSON string
	// Resource is the path of the resource the operation created or acted
	// on, e.g. /v1/notes/{id}; empty when it acted on nothing.
	Resource string
	// Outcome names what the operation did, in its action's words
	// ("created", "deleted"); Body is the response its handler rendered.
	// Both are replayed as they are; a tombstone keeps the outcome only.
	Outcome string
	Body    []byte
	// ResourceVersion is the version the operation left its resource at,
	// replayed as the ETag; 0 for none (a refusal, a record written before
	// versions).
	ResourceVersion int
	CreatedAt       time.Time
	CompletedAt     time.Time
	ExpiresAt       time.Time
	ForgetAt        time.Time
	CompactedAt     *time.Time
}

// Verdict is what a recorded operation means for a new request with its key.
type Verdict int

const (
	// Replay: same intent, response still retained — answer with it.
	Replay Verdict = iota + 1
	// Reused: the key belongs to different parameters or another action.
	Reused
	// Expired: same intent, but only the tombstone is left.
	Expired
	// Forgotten: the key retention has passed; the record no longer counts.
	Forgotten
)

// Decide returns what rec means for a request with fingerprint fp at now, and
// for Reused the names of the parameters that differ ("action" when the
// action differs).
func Decide(rec *Record, fp Fingerprint, now time.Time) (Verdict, []string) {
	if !now.Before(rec.ForgetAt) {
		return Forgotten, nil
	}
	if rec.Action != fp.Action {
		return Reused, []string{"action"}
	}
	if !bytes.Equal(rec.Fingerprint, fp.Sum) {
		fields := DiffFields(rec.fieldHashes(), fp.Fields())
		if len(fields) == 0 {
			fields = []string{"v"} // same parameters, another parameter version
		}
		return Reused, fields
	}
	if rec.Expired(now) {
		return Expired, nil
	}
	return Replay, nil
}

// Expired reports whether rec's response is no longer replayed at now.
func (r *Record) Expired(now time.Time) bool {
	return r.CompactedAt != nil || r.Body == nil || !now.Before(r.ExpiresAt)
}

// Querier runs statements: a pool, a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const (
	sqlOperationGet = `SELECT tenant, key, action, version, fingerprint, field_hashes,
		coalesce(resource, ''), outcome, response_body,
		created_at, completed_at, expires_at, forget_at, compacted_at, coalesce(resource_version, 0)
	FROM operations WHERE tenant = $1 AND key = $2`

	sqlAdvisoryTryLock = `SELECT pg_try_advisory_xact_lock($1)`

	sqlAdvisoryTryLockShared = `SELECT pg_try_advisory_xact_lock_shared($1)`

	sqlOperationsCompact = `UPDATE operations SET response_body = NULL, compacted_at = coalesce($1, now())
	WHERE (tenant, key) IN (
		SELECT tenant, key FROM operations
		WHERE compacted_at IS NULL AND expires_at <= coalesce($1, now())
		ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`

	sqlOperationsForget = `DELETE FROM operations
	WHERE (tenant, key) IN (
		SELECT tenant, key FROM operations
		WHERE forget_at <= coalesce($1, now())
		ORDER BY forget_at LIMIT $2 FOR UPDATE SKIP LOCKED)`
)

func scanRecord(row pgx.Row) (*Record, error) {
	var r Record
	err := row.Scan(&r.Tenant, &r.Key, &r.Action, &r.Version, &r.Fingerprint, &r.Fields,
		&r.Resource, &r.Outcome, &r.Body,
		&r.CreatedAt, &r.CompletedAt, &r.ExpiresAt, &r.ForgetAt, &r.CompactedAt, &r.ResourceVersion)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read operation: %w", err)
	}
	return &r, nil
}

// RecordGet returns the record of (tenant, key), or nil when none is
// committed. Errors are the driver's, wrapped.
func RecordGet(ctx context.Context, q Querier, tenant, key string) (*Record, error) {
	return scanRecord(q.QueryRow(ctx, sqlOperationGet, tenant, key))
}

// QueueClaim queues, into b, the two statements that open an execution
// attempt inside a transaction: try the operation's advisory lock, and read
// its record. After the batch ran, *locked says whether this transaction now
// owns execution and *rec holds the committed record, if any.
func QueueClaim(b *pgx.Batch, tenant, key string, locked *bool, rec **Record) {
	queueLockAndGet(b, sqlAdvisoryTryLock, tenant, key, locked, rec)
}

// QueueProbe is QueueClaim for readers: it takes the lock shared, so that
// readers never mistake each other for an executing request. *free says
// whether no request is executing the operation now; while the transaction
// lasts, none can start.
func QueueProbe(b *pgx.Batch, tenant, key string, free *bool, rec **Record) {
	queueLockAndGet(b, sqlAdvisoryTryLockShared, tenant, key, free, rec)
}

func queueLockAndGet(b *pgx.Batch, lockSQL, tenant, key string, got *bool, rec **Record) {
	b.Queue(lockSQL, LockID(tenant, key)).QueryRow(func(row pgx.Row) error {
		return row.Scan(got)
	})
	b.Queue(sqlOperationGet, tenant, key).QueryRow(func(row pgx.Row) error {
		r, err := scanRecord(row)
		*rec = r
		return err
	})
}

// Claimed is the flag (see db.Flag) that the claim statement (ClaimWrite)
// turns on when it claimed the operation and wrote its record. Statements
// that follow it in the attempt's round trip are guarded by it, so that
// they write nothing when the claim failed.
const Claimed db.Flag = "quill.claimed"

// Claim is the outcome of a claim statement (ClaimWrite).
type Claim struct {
	// Locked: this transaction holds the operation's lock.
	Locked bool
	// Claimed: it holds the lock, the key had no live record — none, or
	// one past its key retention, which the statement replaced — and the
	// record and the effect were written.
	Claimed bool
	// Record is the record the statement saw, if any (also a forgotten
	// one).
	Record *Record
}

// scanClaim reads a claim's row: locked, claimed, then the record's
// columns, all NULL when there is none. A failure is wrapped with what.
//
// A claimed key has no record, and a create claims: that row's two
// booleans are read from their raw bytes, since planning and running
// pgx's scan of sixteen destinations was a tenth of the allocations of a
// create (issue 29). A row with a record takes pgx's scan.
func scanClaim(rows pgx.Rows, what, tenant string, c *Claim) error {
	if !rows.Next() {
		err := rows.Err()
		if err == nil {
			err = pgx.ErrNoRows
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if raw := rows.RawValues(); len(raw) == claimColumns && raw[2] == nil {
		fds := rows.FieldDescriptions()
		locked, ok1 := rawBool(raw[0], fds[0].Format)
		claimed, ok2 := rawBool(raw[1], fds[1].Format)
		if ok1 && ok2 {
			c.Locked, c.Claimed, c.Record = locked, claimed, nil
			return nil
		}
	}
	var (
		r                               Record
		rkey, action, resource, outcome *string
		version, resourceVersion        *int
		created, completed, exp, forget *time.Time
	)
	err := rows.Scan(&c.Locked, &c.Claimed, &rkey, &action, &version, &r.Fingerprint, &r.Fields,
		&resource, &outcome, &r.Body, &created, &completed, &exp, &forget, &r.CompactedAt, &resourceVersion)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if rkey == nil {
		c.Record = nil
		return nil
	}
	r.Tenant, r.Key, r.Action, r.Version, r.Resource, r.Outcome = tenant, *rkey, *action, *version, *resource, *outcome
	r.CreatedAt, r.CompletedAt, r.ExpiresAt, r.ForgetAt = *created, *completed, *exp, *forget
	if resourceVersion != nil {
		r.ResourceVersion = *resourceVersion
	}
	c.Record = &r
	return nil
}

// claimColumns is how many columns a claim's row has.
const claimColumns = 16

// rawBool decodes a non-NULL boolean in either wire format; ok is false for
// anything else (the caller then scans it the general way).
func rawBool(b []byte, format int16) (v, ok bool) {
	if len(b) != 1 {
		return false, false
	}
	switch {
	case format == pgx.BinaryFormatCode && (b[0] == 0 || b[0] == 1):
		return b[0] == 1, true
	case format == pgx.TextFormatCode && (b[0] == 't' || b[0] == 'f'):
		return b[0] == 't', true
	}
	return false, false
}

// appendRecordArgs appends the parameters of r's insert, in
// operationInsert's order, to dst, kept in a; tenant and key are r's,
// already made parameters.
func appendRecordArgs(dst []any, a *db.Args, r *Record, tenant, key any) []any {
	return append(dst, tenant, key, a.Text(r.Action), r.Version, a.Bytes(r.Fingerprint),
		r.fieldsArg(), a.Text(r.Resource), a.Text(r.Outcome), a.Bytes(r.Body),
		a.Time(r.CreatedAt), a.Time(r.CompletedAt), a.Time(r.ExpiresAt), a.Time(r.ForgetAt), resourceVersionArg(r.ResourceVersion))
}

// fieldHashes are the record's parameters' hashes, by name.
func (r *Record) fieldHashes() map[string]string {
	if r.Fields != nil || r.fieldsJSON == "" {
		return r.Fields
	}
	return parseFields(r.fieldsJSON)
}

// fieldsArg is the record's field_hashes parameter.
func (r *Record) fieldsArg() any {
	if r.fieldsJSON != "" {
		return r.fieldsJSON
	}
	return fieldsJSON(r.Fields)
}

// resourceVersionArg is a record's resource version as its column holds
// it: NULL for none.
func resourceVersionArg(v int) any {
	if v == 0 {
		return nil
	}
	return int32(v)
}

// fieldsJSON is the JSON object of the field hashes, members sorted, as
// text: pgx sends a string to a jsonb parameter as it is, where it would
// marshal a map through encoding/json's reflection on every write — and in
// every query mode, where bytes would go as bytea text in the exec and
// simple protocol modes. Names
// are parameter names and values hex digests, so quoting cannot fail; a
// name that would not quote falls back to the map (pgx marshals it).
func fieldsJSON(fields map[string]string) any {
	if fields == nil {
		return fields
	}
	names := slices.Sorted(maps.Keys(fields))
	out := make([]byte, 0, 2+len(fields)*(72+16))
	out = append(out, '{')
	var err error
	for i, name := range names {
		if i > 0 {
			out = append(out, ',')
		}
		if out, err = jsontext.AppendQuote(out, name); err != nil {
			return fields
		}
		out = append(out, ':')
		if out, err = jsontext.AppendQuote(out, fields[name]); err != nil {
			return fields
		}
	}
	return string(append(out, '}'))
}

// sqlOperationsAddReplays adds counted replays to their operations. A record
// forgotten (or executed again under the key) since is not matched: its
// count is dropped.
const sqlOperationsAddReplays = `UPDATE operations o SET replays = o.replays + u.n::int
	FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[]) AS u(tenant, key, created_at, n)
	WHERE o.tenant = u.tenant AND o.key = u.key AND o.created_at = u.created_at`

// AddReplays adds ns[i] answered replays to the record (tenants[i], keys[i])
// created at created[i], skipping records forgotten or executed again since.
// The slices have one length. It returns the driver's error, wrapped.
func AddReplays(ctx context.Context, q Querier, tenants, keys []string, created []time.Time, ns []int64) error {
	if _, err := q.Exec(ctx, sqlOperationsAddReplays, tenants, keys, created, ns); err != nil {
		return fmt.Errorf("add replays: %w", err)
	}
	return nil
}

// Compact turns up to batch records whose response retention ended by
// asOf into tombstones, and returns how many it compacted; the zero asOf
// is the database's clock, which the retention service uses (db.AsOf).
// Safe to run from several processes at once.
func Compact(ctx context.Context, q Querier, asOf time.Time, batch int) (int64, error) {
	tag, err := q.Exec(ctx, sqlOperationsCompact, db.AsOf(asOf), batch)
	return db.Affected("compact operations", tag, err)
}

// Forget deletes up to batch records whose key retention ended by asOf
// (zero: the database's clock, as for Compact), and returns how many it
// deleted. Safe to run from several processes at once.
func Forget(ctx context.Context, q Querier, asOf time.Time, batch int) (int64, error) {
	tag, err := q.Exec(ctx, sqlOperationsForget, db.AsOf(asOf), batch)
	return db.Affected("forget operations", tag, err)
}
