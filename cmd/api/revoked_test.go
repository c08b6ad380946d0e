package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
)

// TestRevocationsReappliedAfterARestore follows the restore runbook: the
// revocations made after the backup's time are listed ("api token revoked
// --since") from the database before it is replaced; the restore brings
// those tokens back; each listed prefix revoked again refuses them again.
// A token created after the backup is not in the restored database: its
// revoke answers that no token has the prefix, which is expected.
func TestRevocationsReappliedAfterARestore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := dbtest.Schema(t)
	getenv := clitest.Env(map[string]string{"DATABASE_URL": u})
	before := createToken(t, getenv)
	op, _, err := clitest.RunOut(t, run, getenv, "token", "create", "--operator", "--name", "alice")
	require.NoError(t, err)
	op = strings.TrimSpace(op)
	kept := createToken(t, getenv)
	_, _, err = clitest.RunOut(t, run, getenv, "token", "revoke", before[:11])
	require.NoError(t, err)

	// The backup's time, at the database's resolution: every revocation
	// below is at or after it.
	backup := time.Now().UTC().Truncate(time.Microsecond)
	after := createToken(t, getenv) // made after the backup: not in it
	for _, tok := range []string{kept, op, after} {
		_, _, err = clitest.RunOut(t, run, getenv, "token", "revoke", tok[:11])
		require.NoError(t, err)
	}

	out, _, err := clitest.RunOut(t, run, getenv, "token", "revoked", "--since", backup.Format(time.RFC3339Nano))
	require.NoError(t, err)
	var listed []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		prefix, at, ok := strings.Cut(line, "\t")
		require.True(t, ok, "prefix TAB time: %q", line)
		_, err := time.Parse(time.RFC3339Nano, at)
		require.NoError(t, err)
		listed = append(listed, prefix)
	}
	require.Equal(t, []string{kept[:11], op[:11], after[:11]}, listed, "the revocations since the backup, oldest first")
	all, _, err := clitest.RunOut(t, run, getenv, "token", "revoked")
	require.NoError(t, err)
	require.Equal(t, 4, strings.Count(all, "\n"), "without --since: every revocation")

	// The restore: the database as it was at the backup's time.
	conn, err := pgx.Connect(ctx, u)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE api_tokens SET revoked_at = NULL WHERE revoked_at >= $1`, backup)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE operator_tokens SET revoked_at = NULL WHERE revoked_at >= $1`, backup)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `DELETE FROM api_tokens WHERE prefix = $1`, after[:11])
	require.NoError(t, err)
	_, err = auth.Authenticate(ctx, conn, "Bearer "+kept)
	require.NoError(t, err, "the restore brought the revoked token back")

	for _, prefix := range listed {
		_, _, err := clitest.RunOut(t, run, getenv, "token", "revoke", prefix)
		if prefix == after[:11] {
			require.ErrorIs(t, err, auth.ErrTokenNotFound)
			continue
		}
		require.NoError(t, err)
	}
	_, err = auth.Authenticate(ctx, conn, "Bearer "+kept)
	require.ErrorIs(t, err, auth.ErrUnauthenticated)
	_, err = auth.AuthenticateOperator(ctx, conn, op)
	require.Error(t, err)

	_, _, err = clitest.RunOut(t, run, getenv, "token", "revoked", "--since", "yesterday")
	var stderr bytes.Buffer
	require.Equal(t, 2, exitCode(err, &stderr))
	require.Contains(t, stderr.String(), "RFC 3339")
}
