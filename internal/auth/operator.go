package auth

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
)

// operatorScheme starts every operator token. It differs from tenant
// tokens' so that each kind is refused where the other belongs before any
// query: a tenant token never signs in to the console, and an operator
// token never reaches a tenant's notes.
const operatorScheme = "qo_"

// Operator token layout: qo_<8 hex: prefix>_<43 base64url: 32 random
// bytes> (isToken). An operator's name is what operatorNameRE matches.
var operatorNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$`)

var (
	// ErrInvalidOperatorName: an operator's name is not 1-63 characters
	// of letters, digits, '.', '_', '@' and '-'.
	ErrInvalidOperatorName = errors.New("operator names are 1-63 characters of letters, digits, '.', '_', '@' and '-', starting with a letter or digit")
	// ErrTenantToken: a tenant token was offered where an operator token is
	// needed.
	ErrTenantToken = errors.New("this is a tenant token (qt_…); the console needs an operator token (qo_…, made by \"api token create --operator\")")
)

// ValidOperatorName reports whether name may name an operator token.
func ValidOperatorName(name string) bool { return operatorNameRE.MatchString(name) }

// IsOperatorToken reports whether s has an operator token's form (it says
// nothing about whether the token exists).
func IsOperatorToken(s string) bool { return isToken(s, operatorKind) }

const (
	sqlOperatorInsert = `INSERT INTO operator_tokens (prefix, hash, name, created_at) VALUES ($1, $2, $3, $4)`
	sqlOperatorRevoke = `UPDATE operator_tokens SET revoked_at = coalesce(revoked_at, $2) WHERE prefix = $1`
	sqlOperatorLookup = `SELECT name, hash FROM operator_tokens WHERE prefix = $1 AND revoked_at IS NULL`
	sqlOperatorValid  = `SELECT EXISTS (SELECT 1 FROM operator_tokens WHERE prefix = $1 AND revoked_at IS NULL)`
)

// CreateOperator issues a new operator token named name (who holds it, for
// the console's audit log) and returns it; it is shown once and never
// stored. Errors: ErrInvalidOperatorName, database errors.
func CreateOperator(ctx context.Context, q idempotency.Querier, name string, now time.Time) (string, error) {
	if !ValidOperatorName(name) {
		return "", fmt.Errorf("%w: %q", ErrInvalidOperatorName, name)
	}
	return issue(ctx, q, operatorScheme, "operator token", sqlOperatorInsert, name, now)
}

// Operator is who an operator token belongs to.
type Operator struct {
	// Prefix is the token's public part (qo_xxxxxxxx).
	Prefix string
	// Name is the name it was made with.
	Name string
}

// AuthenticateOperator returns the operator whose token tok is. Errors:
// ErrTenantToken for a tenant token; ErrUnauthenticated for anything else
// that is not a valid, unrevoked operator token; a database error (wrapping
// db.ErrUnavailable when it is unreachable).
func AuthenticateOperator(ctx context.Context, q idempotency.Querier, tok string) (Operator, error) {
	tok = strings.TrimSpace(tok)
	if isToken(tok, tenantKind) {
		return Operator{}, ErrTenantToken
	}
	if !isToken(tok, operatorKind) {
		return Operator{}, ErrUnauthenticated
	}
	op := Operator{Prefix: tok[:len(operatorScheme)+8]}
	var stored []byte
	err := q.QueryRow(ctx, sqlOperatorLookup, op.Prefix).Scan(&op.Name, &stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operator{}, ErrUnauthenticated
	}
	if err != nil {
		return Operator{}, fmt.Errorf("look up operator token: %w", db.Translate(err))
	}
	if subtle.ConstantTimeCompare(stored, hashToken(tok)) != 1 {
		return Operator{}, ErrUnauthenticated
	}
	return op, nil
}

// OperatorValid reports whether the operator token with prefix exists and
// is not revoked: a console session made with it lasts only as long.
// Errors: database errors.
func OperatorValid(ctx context.Context, q idempotency.Querier, prefix string) (bool, error) {
	var ok bool
	if err := q.QueryRow(ctx, sqlOperatorValid, prefix).Scan(&ok); err != nil {
		return false, fmt.Errorf("check operator token: %w", db.Translate(err))
	}
	return ok, nil
}
