package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
)

// Fifty hostile connections — headers never finished; a body announced
// and never sent, without a token or with one — are each closed within
// the read timeout, while another caller is served meanwhile. The
// token-less ones are answered 401 at once, not after waiting for their
// body.
func TestSlowConnectionsAreClosedWithinTheReadTimeout(t *testing.T) {
	t.Parallel()
	const readTimeout = time.Second
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": freeAddr(t), "QUILL_ADMIN_ADDR": freeAddr(t),
		"QUILL_READ_TIMEOUT": readTimeout.String(), "QUILL_WRITE_TIMEOUT": "5s", "QUILL_IDLE_TIMEOUT": "5s"}
	getenv := env(vars)
	tok, _, err := runOut(t, getenv, "token", "create", "--tenant", "acme")
	require.NoError(t, err)
	tok = strings.TrimSpace(tok)
	start(t, getenv, "serve")
	waitReady(t, "http://"+vars["QUILL_ADMIN_ADDR"]+"/readyz")
	addr := vars["QUILL_HTTP_ADDR"]

	kinds := []struct {
		name, send string
		status     string // the status line expected before the close; "" none
	}{
		{"headers never finished", "POST /v1/notes HTTP/1.1\r\nHost: quill\r\nContent-Type: application/json\r\n", ""},
		{"body never sent, no token", "POST /v1/notes HTTP/1.1\r\nHost: quill\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n", "HTTP/1.1 401"},
		{"body never sent, with a token", "POST /v1/notes HTTP/1.1\r\nHost: quill\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n" +
			"Authorization: Bearer " + tok + "\r\nIdempotency-Key: slow\r\n\r\n{\"title\":", ""},
	}
	type outcome struct {
		kind  int
		first string
		// answered and closed: since the connections were opened.
		answered, closed time.Duration
		err              error
	}
	results := make(chan outcome, 50)
	var opened sync.WaitGroup
	began := time.Now()
	for i := range 50 {
		k := i % len(kinds)
		opened.Add(1)
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				opened.Done()
				results <- outcome{kind: k, err: err}
				return
			}
			defer c.Close()
			_, err = io.WriteString(c, kinds[k].send)
			opened.Done()
			if err != nil {
				results <- outcome{kind: k, err: err}
				return
			}
			// Read until the server closes; the test's own deadline
			// only stops a connection the server never closes.
			_ = c.SetReadDeadline(time.Now().Add(readTimeout + 5*time.Second))
			first, err := bufio.NewReader(c).ReadString('\n')
			answered := time.Since(began)
			for err == nil {
				_, err = c.Read(make([]byte, 512))
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
				err = nil
			}
			results <- outcome{kind: k, first: first, answered: answered, closed: time.Since(began), err: err}
		}()
	}
	opened.Wait()

	// Meanwhile another caller is served, promptly.
	t0 := time.Now()
	res, body := post(t, "http://"+addr, tok, "legit", `{"title":"served"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode, body)
	require.Less(t, time.Since(t0), readTimeout, "a legitimate request does not wait for the slow ones")

	for range 50 {
		o := <-results
		k := kinds[o.kind]
		require.NoError(t, o.err, "%s: the server closed the connection", k.name)
		require.Less(t, o.closed, readTimeout+2*time.Second, "%s: closed within the read timeout", k.name)
		if k.status != "" {
			require.True(t, strings.HasPrefix(o.first, k.status), "%s: answered %q", k.name, o.first)
			require.Less(t, o.answered, readTimeout/2, "%s: answered at once, not after waiting for the body", k.name)
		}
	}
}

// isReset: a server that closes with unread input sends a reset.
func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
