package auth

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
)

// Revocation is one revoked token, a tenant's or an operator's.
type Revocation struct {
	// Prefix is the token's public part (qt_… or qo_…), what Revoke takes.
	Prefix string
	// RevokedAt is when it was revoked.
	RevokedAt time.Time
}

// sqlRevokedSince lists both tables' revocations at or after $1, oldest
// first.
const sqlRevokedSince = `SELECT prefix, revoked_at FROM api_tokens WHERE revoked_at >= $1
	UNION ALL SELECT prefix, revoked_at FROM operator_tokens WHERE revoked_at >= $1
	ORDER BY revoked_at, prefix`

// RevokedSince returns every token, a tenant's or an operator's, revoked
// at or after since, oldest revocation first: after a restore from a
// backup, which brings back the tokens revoked later, these are the
// revocations to make again (docs/operations.md, "Restoring from a
// backup"). Errors are the database's, translated.
func RevokedSince(ctx context.Context, q idempotency.Querier, since time.Time) ([]Revocation, error) {
	rows, err := q.Query(ctx, sqlRevokedSince, since)
	if err != nil {
		return nil, fmt.Errorf("list revoked tokens: %w", db.Translate(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Revocation])
	if err != nil {
		return nil, fmt.Errorf("list revoked tokens: %w", db.Translate(err))
	}
	return out, nil
}
