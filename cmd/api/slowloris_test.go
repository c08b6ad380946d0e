package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
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
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"QUILL_READ_TIMEOUT": readTimeout.String(), "QUILL_WRITE_TIMEOUT": "5s", "QUILL_IDLE_TIMEOUT": "5s"}
	getenv := clitest.Env(vars)
	tok := createToken(t, getenv)
	startServe(t, vars)
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

// TestRefusalsBeforeTheBodyKeepOrEndTheConnectionAtOnce: an answer decided
// before the body was read (here a 401) keeps the connection when the small
// body is there, so that a refused client (a flood, an agent told 429)
// need not connect again for its next request, and ends it at once —
// not after QUILL_READ_TIMEOUT — when the announced body never comes.
func TestRefusalsBeforeTheBodyKeepOrEndTheConnectionAtOnce(t *testing.T) {
	t.Parallel()
	const readTimeout = 30 * time.Second
	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"QUILL_READ_TIMEOUT": readTimeout.String()}
	startServe(t, vars)
	addr := vars["QUILL_HTTP_ADDR"]
	const head = "POST /v1/notes HTTP/1.1\r\nHost: quill\r\nContent-Type: application/json\r\nIdempotency-Key: k\r\nContent-Length: "

	t.Run("small body sent: the connection is reused", func(t *testing.T) {
		t.Parallel()
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		br := bufio.NewReader(c)
		body := `{"title":"refused"}`
		for i := range 3 {
			_, err = io.WriteString(c, head+strconv.Itoa(len(body))+"\r\n\r\n"+body)
			require.NoError(t, err)
			res, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "request %d on the same connection", i+1)
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			require.Equal(t, http.StatusUnauthorized, res.StatusCode)
			require.False(t, res.Close, "request %d: the answer keeps the connection", i+1)
		}
	})
	for _, n := range []int{1000, 100000, 1 << 20} {
		t.Run(fmt.Sprintf("%d bytes announced, none sent: closed at once", n), func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.SetDeadline(time.Now().Add(readTimeout/2)))
			t0 := time.Now()
			_, err = io.WriteString(c, head+strconv.Itoa(n)+"\r\n\r\n")
			require.NoError(t, err)
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusUnauthorized, res.StatusCode)
			_, err = io.Copy(io.Discard, res.Body)
			for err == nil {
				_, err = c.Read(make([]byte, 512))
			}
			require.True(t, errors.Is(err, io.EOF) || isReset(err), "the server ends the connection, got %v", err)
			require.Less(t, time.Since(t0), 5*time.Second, "closed long before the read timeout (%s)", readTimeout)
		})
	}
}
