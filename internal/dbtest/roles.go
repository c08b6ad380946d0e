package dbtest

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/deploy/postgres"
)

// RoleURLs are the URLs of Roles' two roles on its schema.
type RoleURLs struct {
	// Owner owns the schema; it runs the migrations.
	Owner string
	// Runtime may only read and write rows.
	Runtime string
	// Schema is the schema's name; the roles' search_path.
	Schema string
}

// Roles runs deploy/postgres/roles.sql as the operator would (psql's
// variables substituted) for an owner, a runtime role and a schema named
// for t alone, on the test database, and returns the URLs of the two roles
// (without a search_path of their own: the roles' setting gives it). The
// schema is not migrated. The roles and the schema are dropped when t
// ends.
func Roles(t testing.TB) RoleURLs {
	t.Helper()
	ctx := context.Background()
	base := URL()
	Schema(t) // the test database exists and is migrated once
	suffix := randomName("")
	owner, runtime, schema := "quill_owner_"+suffix, "quill_app_"+suffix, "quill_"+suffix
	sql := postgres.RolesSQL
	for name, value := range map[string]string{"owner": owner, "runtime": runtime, "schema": schema} {
		sql = strings.ReplaceAll(sql, `:"`+name+`"`, pgx.Identifier{value}.Sanitize())
	}
	require.NotContains(t, sql, `:"`, "every psql variable of roles.sql is substituted")
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		o, r := pgx.Identifier{owner}.Sanitize(), pgx.Identifier{runtime}.Sanitize()
		for _, s := range []string{"DROP SCHEMA IF EXISTS " + pgx.Identifier{schema}.Sanitize() + " CASCADE",
			"DROP OWNED BY " + o + ", " + r, "DROP ROLE " + o + ", " + r} {
			if err := exec(cctx, base, s); err != nil {
				t.Logf("%s: %v", s, err)
			}
		}
	})
	require.NoError(t, exec(ctx, base, sql), "deploy/postgres/roles.sql")
	as := func(role string) string {
		u, err := url.Parse(base)
		require.NoError(t, err)
		u.User = url.User(role)
		return u.String()
	}
	return RoleURLs{Owner: as(owner), Runtime: as(runtime), Schema: schema}
}
