package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/problem"
)

// api serve answers a request that is not HTTP/1.1 as a problem on both of
// its addresses (SPEC §3: every error is problem+json with an X-Request-Id),
// not in net/http's plain text.
func TestServeAnswersUnreadableRequestsAsProblems(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t)}
	startServe(t, vars)
	for _, addr := range []string{vars["QUILL_HTTP_ADDR"], vars["QUILL_ADMIN_ADDR"]} {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		_, err = io.WriteString(c, "POST /v1/notes HTTP/1.1\r\nHost: quill\r\nthis is no header\r\n\r\n")
		require.NoError(t, err)
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		c.Close()
		require.Equal(t, http.StatusBadRequest, res.StatusCode, addr)
		require.Equal(t, problem.ContentType, res.Header.Get("Content-Type"), addr)
		require.NotEmpty(t, res.Header.Get("X-Request-Id"), addr)
		require.True(t, strings.Contains(string(body), `"code":"bad_request"`), "%s: %s", addr, body)
	}
}
