package idempotency

import (
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/internal/db"
)

// operationInsert is the operation record's insert, in appendRecordArgs'
// order, for ClaimWrite.
var operationInsert = db.Insert{Table: "operations", Columns: []db.Column{
	{Name: "tenant", Type: "text"}, {Name: "key", Type: "text"}, {Name: "action", Type: "text"},
	{Name: "version", Type: "int"}, {Name: "fingerprint", Type: "bytea"}, {Name: "field_hashes", Type: "jsonb"},
	{Name: "resource", Type: "text", NullIfEmpty: true}, {Name: "outcome", Type: "text"},
	{Name: "response_body", Type: "bytea"},
	{Name: "created_at", Type: "timestamptz"}, {Name: "completed_at", Type: "timestamptz"},
	{Name: "expires_at", Type: "timestamptz"}, {Name: "forget_at", Type: "timestamptz"},
	{Name: "resource_version", Type: "int"},
}}

// sqlReplaceForgotten ends the record's insert: a record past its key
// retention is replaced whole, as if it had been deleted; a live one (a
// record committed after the statement's snapshot) is left as it is, and
// the insert returns no row, so nothing of the effect is written.
const sqlReplaceForgotten = `
	ON CONFLICT (tenant, key) DO UPDATE SET action = EXCLUDED.action, version = EXCLUDED.version,
		fingerprint = EXCLUDED.fingerprint, field_hashes = EXCLUDED.field_hashes, resource = EXCLUDED.resource,
		outcome = EXCLUDED.outcome, response_body = EXCLUDED.response_body, created_at = EXCLUDED.created_at,
		completed_at = EXCLUDED.completed_at, expires_at = EXCLUDED.expires_at, forget_at = EXCLUDED.forget_at,
		resource_version = EXCLUDED.resource_version,
		compacted_at = NULL, replays = 0, cleaned_events = NULL
	WHERE operations.forget_at <= EXCLUDED.created_at
	RETURNING true AS written`

// ClaimWrite is the one statement that claims an operation and, only when
// it claimed it, writes its record and its effect (one row of each of its
// inserts), and turns Claimed on for the statements queued after it. Every
// write is one: build it once per effect (its text is the prepared
// statement's) and Queue it per attempt.
//
// It claims a key whose record, if any, is past its key retention: the
// record is replaced (sqlReplaceForgotten). The record's snapshot is the
// statement's; a record committed after it (by a transaction that held the
// lock until its COMMIT, before this one took it) conflicts with the
// insert, which then writes nothing and returns no row: the effect's
// inserts read that row, so they write nothing either, and the claim
// reports not claimed without a record — the caller tries again.
type ClaimWrite struct {
	sql     string
	effects []db.Insert
}

// NewClaimWrite returns the ClaimWrite whose effect is one row of each
// insert, in this order (none: an operation that inserts nothing).
func NewClaimWrite(effects ...db.Insert) *ClaimWrite {
	created := 4 + slices.IndexFunc(operationInsert.Columns, func(c db.Column) bool { return c.Name == "created_at" })
	// claim is read by the record's insert and the final SELECT:
	// MATERIALIZED (as it would be anyway, being read more than once, and
	// volatile) so that the lock is tried exactly once. The effect's
	// inserts read the record's, so PostgreSQL runs that one first.
	sql := fmt.Appendf(nil, `WITH lk AS (SELECT pg_try_advisory_xact_lock($1) AS locked),
rec AS (SELECT * FROM operations WHERE tenant = $2 AND key = $3),
claim AS MATERIALIZED (SELECT lk.locked,
	lk.locked AND NOT EXISTS (SELECT 1 FROM rec WHERE rec.forget_at > $%d) AS claimed FROM lk),
w0 AS (`, created)
	sql, next := operationInsert.AppendGuarded(sql, "claim", "claimed", 4)
	sql = append(sql, sqlReplaceForgotten...)
	for i, e := range effects {
		sql = fmt.Appendf(sql, "),\nw%d AS (", i+1)
		sql, next = e.AppendGuarded(sql, "w0", "written", next)
	}
	sql = fmt.Appendf(sql, `)
SELECT claim.locked,
	set_config('%s', CASE WHEN EXISTS (SELECT 1 FROM w0) THEN 'on' ELSE 'off' END, true)::boolean,
	rec.key, rec.action, rec.version, rec.fingerprint, rec.field_hashes,
	coalesce(rec.resource, ''), rec.outcome, rec.response_body,
	rec.created_at, rec.completed_at, rec.expires_at, rec.forget_at, rec.compacted_at, rec.resource_version
FROM claim LEFT JOIN rec ON true`, Claimed)
	return &ClaimWrite{sql: string(sql), effects: effects}
}

// Queue queues into b, inside a transaction, the statement that claims
// rec's operation and, when claimed, writes rec and one row of each effect
// insert, args[i] being the parameters of effects[i]; rec's parameters are
// kept in a (nil: boxed one by one). After the batch ran, c says whether
// it claimed (and so wrote). It returns an error, queueing nothing, when
// args does not match the inserts.
func (w *ClaimWrite) Queue(b *pgx.Batch, a *db.Args, rec *Record, c *Claim, args ...[]any) error {
	if err := w.check(args); err != nil {
		return err
	}
	n := 3 + len(operationInsert.Columns)
	for _, a := range args {
		n += len(a)
	}
	all := make([]any, 0, n)
	// The tenant and the key are parameters twice each; boxed once.
	tenant, key := a.Text(rec.Tenant), a.Text(rec.Key)
	all = append(all, a.Int64(LockID(rec.Tenant, rec.Key)), tenant, key)
	all = appendRecordArgs(all, a, rec, tenant, key)
	for _, a := range args {
		all = append(all, a...)
	}
	b.Queue(w.sql, all...).Query(func(rows pgx.Rows) error { return scanClaim(rows, "claim and write operation", rec.Tenant, c) })
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
