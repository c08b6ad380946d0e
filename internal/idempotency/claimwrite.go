package idempotency

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/internal/db"
)

// operationInsert is the operation record's insert, in recordArgs' order,
// for ClaimWrite.
var operationInsert = db.Insert{Table: "operations", Columns: []db.Column{
	{Name: "tenant", Type: "text"}, {Name: "key", Type: "text"}, {Name: "action", Type: "text"},
	{Name: "version", Type: "int"}, {Name: "fingerprint", Type: "bytea"}, {Name: "field_hashes", Type: "jsonb"},
	{Name: "resource", Type: "text", NullIfEmpty: true}, {Name: "response_status", Type: "int"},
	{Name: "response_body", Type: "bytea"}, {Name: "response_location", Type: "text", NullIfEmpty: true},
	{Name: "created_at", Type: "timestamptz"}, {Name: "completed_at", Type: "timestamptz"},
	{Name: "expires_at", Type: "timestamptz"}, {Name: "forget_at", Type: "timestamptz"},
}}

// ClaimWrite is one statement that claims an operation and, only when it
// claimed it, writes the operation's effect (the rows of its inserts) and
// its record: the create's whole write in one statement, where
// QueueClaimGuarded and guarded statements take one each. Build it once (its
// text is the prepared statement's) and Queue it per operation.
//
// It claims a key that has no record at all. A forgotten record (past its
// key retention) is left to QueueClaimGuarded, which deletes it before it
// writes the new one: the claim then fails with Locked and Record set, and
// the caller ends this transaction and claims the key that way.
type ClaimWrite struct {
	sql     string
	effects []db.Insert
	// guarded is each effect insert as a statement of its own guarded by
	// Claimed, for QueueEffectsGuarded.
	guarded []string
}

// NewClaimWrite returns the ClaimWrite whose effect is one row of each
// insert, in this order.
func NewClaimWrite(effects ...db.Insert) *ClaimWrite {
	// claim is read by every insert and the final SELECT: MATERIALIZED
	// (as it would be anyway, being read more than once, and volatile)
	// so that the lock is tried exactly once. The record's snapshot is
	// the statement's, as in sqlClaimGuarded; a record committed after it
	// is caught by a unique constraint — the record's primary key, or
	// whichever PostgreSQL checks first of the ids the effect derives
	// from the key — and the attempt fails, writing nothing.
	sql := []byte(`WITH lk AS (SELECT pg_try_advisory_xact_lock($1) AS locked),
rec AS (SELECT * FROM operations WHERE tenant = $2 AND key = $3),
claim AS MATERIALIZED (SELECT lk.locked, lk.locked AND NOT EXISTS (SELECT 1 FROM rec) AS claimed FROM lk),
w0 AS (`)
	sql, next := operationInsert.AppendGuarded(sql, "claim", "claimed", 4)
	for i, e := range effects {
		sql = fmt.Appendf(sql, "),\nw%d AS (", i+1)
		sql, next = e.AppendGuarded(sql, "claim", "claimed", next)
	}
	sql = append(sql, `)
SELECT claim.locked, claim.claimed, rec.key, rec.action, rec.version, rec.fingerprint, rec.field_hashes,
	coalesce(rec.resource, ''), rec.response_status, rec.response_body, coalesce(rec.response_location, ''),
	rec.created_at, rec.completed_at, rec.expires_at, rec.forget_at, rec.compacted_at
FROM claim LEFT JOIN rec ON true`...)
	w := &ClaimWrite{sql: string(sql), effects: effects}
	for _, e := range effects {
		w.guarded = append(w.guarded, e.WhenFlag())
	}
	return w
}

// Queue queues into b, inside a transaction, the statement that claims
// rec's operation and, when claimed, writes rec and one row of each effect
// insert, args[i] being the parameters of effects[i]. After the batch ran,
// c says whether it claimed (and so wrote). It returns an error, queueing
// nothing, when args does not match the inserts.
func (w *ClaimWrite) Queue(b *pgx.Batch, rec *Record, c *Claim, args ...[]any) error {
	if err := w.check(args); err != nil {
		return err
	}
	n := 3 + len(operationInsert.Columns)
	for _, a := range args {
		n += len(a)
	}
	all := make([]any, 0, n)
	all = append(all, LockID(rec.Tenant, rec.Key), rec.Tenant, rec.Key)
	all = appendRecordArgs(all, rec)
	for _, a := range args {
		all = append(all, a...)
	}
	tenant := rec.Tenant
	b.Queue(w.sql, all...).QueryRow(func(row pgx.Row) error { return scanClaim(row, "claim and write operation", tenant, c) })
	return nil
}

// QueueEffectsGuarded queues into b, after QueueClaimGuarded, the rows
// Queue would write, each insert a statement of its own guarded by Claimed
// (args as for Queue): the same effect for the guarded attempt, which a
// key with a forgotten record takes. The record is QueueInsertGuarded's.
// It returns an error, queueing nothing, when args does not match the
// inserts.
func (w *ClaimWrite) QueueEffectsGuarded(b *pgx.Batch, args ...[]any) error {
	if err := w.check(args); err != nil {
		return err
	}
	for i, a := range args {
		b.Queue(w.guarded[i], append(a[:len(a):len(a)], string(Claimed))...)
	}
	return nil
}

// check reports whether args holds one list of parameters per effect
// insert, each as long as its insert's columns.
func (w *ClaimWrite) check(args [][]any) error {
	if len(args) != len(w.effects) {
		return fmt.Errorf("claim-write: %d argument lists for %d inserts", len(args), len(w.effects))
	}
	for i, a := range args {
		if len(a) != len(w.effects[i].Columns) {
			return fmt.Errorf("claim-write: %d arguments for the %d columns of %s", len(a), len(w.effects[i].Columns), w.effects[i].Table)
		}
	}
	return nil
}

// Forgotten reports whether a claim failed only because the key's record is
// forgotten at now: the key is free for a new operation, claimed through
// QueueClaimGuarded.
func (c *Claim) Forgotten(now time.Time) bool {
	return c.Locked && !c.Claimed && c.Record != nil && !now.Before(c.Record.ForgetAt)
}
