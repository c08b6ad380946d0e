package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
)

// TestUnderTheRuntimeRole: "api migrate" as the owner of
// deploy/postgres/roles.sql, then "api token create", "api serve" (a note
// created and read) and "api audit" as the runtime role, which may only
// read and write rows.
func TestUnderTheRuntimeRole(t *testing.T) {
	t.Parallel()
	r := dbtest.Roles(t)
	_, logs, err := clitest.RunOut(t, run, clitest.Env(map[string]string{"DATABASE_URL": r.Owner}), "migrate")
	require.NoError(t, err, logs)

	vars := map[string]string{"DATABASE_URL": r.Runtime, "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"QUILL_CONSOLE": "false"}
	getenv := clitest.Env(vars)
	tok := createToken(t, getenv)
	p := startServe(t, vars)
	base := "http://" + vars["QUILL_HTTP_ADDR"]
	res, body := post(t, base, tok, "runtime-1", `{"title":"as the runtime role"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode, body)
	req, err := http.NewRequest(http.MethodGet, base+res.Header.Get("Location"), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	got, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	got.Body.Close()
	require.Equal(t, http.StatusOK, got.StatusCode)
	require.NoError(t, p.Stop())

	out, logs, err := clitest.RunOut(t, run, getenv, "audit", "--no-stream")
	require.NoError(t, err, "%s%s", out, logs)
}
