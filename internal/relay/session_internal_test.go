package relay

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// The claim and LISTEN sessions have db.StatementTimeout, as the pools'
// sessions do, unless their URL names another.
func TestSessionsHaveTheStatementTimeout(t *testing.T) {
	t.Parallel()
	u := dbtest.Schema(t)
	for _, tc := range []struct{ name, url, want string }{
		{"default", u, db.StatementTimeout},
		{"the URL's", dbtest.WithParam(t, u, "statement_timeout", "9s"), "9s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cc, err := pgx.ParseConfig(tc.url)
			require.NoError(t, err)
			r := &Relay{session: cc, cfg: Config{Lease: DefaultLease}}
			for name, settings := range map[string]map[string]string{"LISTEN": r.keepalives(), "claims": {"enable_sort": "off"}} {
				conn, err := pgx.ConnectConfig(t.Context(), r.sessionConfig(settings))
				require.NoError(t, err)
				var got string
				require.NoError(t, conn.QueryRow(t.Context(), "SHOW statement_timeout").Scan(&got))
				require.Equal(t, tc.want, got, name)
				require.NoError(t, conn.Close(t.Context()))
				require.NotContains(t, settings, "statement_timeout", "the caller's map is left as it was")
			}
		})
	}
}
