package httpserve_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/problem"
)

// What net/http writes itself to a request it cannot read, and what the
// servers answer instead.
func TestRewritePlainError(t *testing.T) {
	const h = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
	for _, tc := range []struct {
		name, reply  string
		status       int
		code, detail string // "" code: left as it is
	}{
		{"bad request", "HTTP/1.1 400 Bad Request" + h + "400 Bad Request", 400, contract.CodeBadRequest, "The request is not valid HTTP/1.1."},
		{"with net/http's reason", "HTTP/1.1 400 Bad Request: missing required Host header" + h + "400 Bad Request: missing required Host header",
			400, contract.CodeBadRequest, "The request is not valid HTTP/1.1: missing required Host header."},
		{"headers too large", "HTTP/1.1 431 Request Header Fields Too Large" + h + "431 Request Header Fields Too Large",
			431, contract.CodeHeadersTooLarge, "The request's headers are larger than 64 KiB."},
		{"transfer encoding", "HTTP/1.1 501 Not Implemented" + h + "Unsupported transfer encoding",
			501, contract.CodeUnsupportedTransferEncoding, "The request's Transfer-Encoding is not supported: send the body with Content-Length or chunked."},
		{"a handler's response", "HTTP/1.1 400 Bad Request\r\nContent-Type: application/problem+json\r\nDate: x\r\n\r\n{}", 0, "", ""},
		{"a handler's plain text", "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nDate: x\r\n\r\nno", 0, "", ""},
		{"the headers later", "HTTP/1.1 400 Bad Request\r\nDate: x" + h, 0, "", ""},
		{"another status", "HTTP/1.1 417 Expectation Failed" + h + "x", 0, "", ""},
		{"a body chunk", "400 Bad Request" + h, 0, "", ""},
		{"empty", "", 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := httpserve.RewritePlainError([]byte(tc.reply))
			if tc.code == "" {
				require.False(t, ok)
				return
			}
			require.True(t, ok)
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tc.status, resp.StatusCode)
			require.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
			require.Regexp(t, `^[0-9a-f]{24}$`, resp.Header.Get("X-Request-Id"))
			require.True(t, resp.Close, "Connection: close")
			var p problem.Problem
			require.NoError(t, json.Unmarshal(body, &p))
			require.Equal(t, *problem.New(tc.status, tc.code, tc.detail), p)
			require.Equal(t, contract.RetryAfterFixing, p.Retry)
		})
	}
}

func FuzzRewritePlainError(f *testing.F) {
	f.Add([]byte("HTTP/1.1 400 Bad Request: x\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nDate: x\r\n\r\n"))
	f.Fuzz(func(t *testing.T, reply []byte) {
		out, ok := httpserve.RewritePlainError(reply)
		if !ok {
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
		if err != nil {
			t.Fatalf("rewrote %q into an unreadable reply: %v", reply, err)
		}
		var p problem.Problem
		body, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(body, &p); err != nil || p.Status != resp.StatusCode {
			t.Fatalf("rewrote %q into %q", reply, out)
		}
	})
}

// Over a real connection to a server from HTTPSettings: requests net/http
// cannot read are answered as problems, and a good request after one on
// another connection is served as usual.
func TestServersAnswerUnreadableRequestsAsProblems(t *testing.T) {
	var hs httpserve.Settings
	ln, err := hs.Listen("127.0.0.1:0")
	require.NoError(t, err)
	srv := ln.Server(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	go func() { _ = srv.Serve(ln) }()
	// Shutdown, not Close: it waits for the connection net/http lingers on
	// after a 431 (closeWriteAndWait), which goleak would see.
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })

	send := func(req string) (*http.Response, problem.Problem) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		_, _ = io.WriteString(c, req) // a server may close before all of a large request is written
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var p problem.Problem
		if resp.Header.Get("Content-Type") == problem.ContentType {
			require.NoError(t, json.Unmarshal(body, &p), "%s", body)
		}
		return resp, p
	}
	for _, tc := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"a header without a colon", "GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400, contract.CodeBadRequest},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 400, contract.CodeBadRequest},
		{"headers past the limit", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", httpserve.MaxHeaderBytes+8192) + "\r\n\r\n", 431, contract.CodeHeadersTooLarge},
		{"a Transfer-Encoding it does not know", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, contract.CodeUnsupportedTransferEncoding},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, p := send(tc.req)
			require.Equal(t, tc.status, resp.StatusCode)
			require.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
			require.NotEmpty(t, resp.Header.Get("X-Request-Id"))
			require.Equal(t, tc.code, p.Code)
			require.Equal(t, tc.status, p.Status)
		})
	}
	resp, _ := send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
