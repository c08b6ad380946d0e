package httpserve

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/problem"
)

// net/http answers a request it cannot read — a malformed request line or
// header, headers past MaxHeaderBytes, an unsupported Transfer-Encoding —
// itself, before any handler runs, with a plain-text reply written straight
// to the connection: the status line, then exactly these headers, then the
// body. Normal responses never have this form (they carry Date, and their
// headers are sorted), so the wrapper below can tell it apart and answer
// instead a problem document with an X-Request-Id, as SPEC §3 wants every
// error to be (decision 0066).
const plainErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// problemConn is a connection whose net/http plain-text error replies are
// rewritten as problems.
type problemConn struct{ net.Conn }

// Write sends p, or its problem form when p is net/http's plain-text reply
// to an unreadable request; it reports len(p) written when the rewrite was.
func (c problemConn) Write(p []byte) (int, error) {
	r, ok := RewritePlainError(p)
	if !ok {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(r); err != nil {
		return 0, err
	}
	return len(p), nil
}

// RewritePlainError returns the problem+json reply for reply when reply is
// net/http's own plain-text answer to a request it could not read, and
// false for anything else (which is sent as it is). The status stays; the
// code is bad_request (400), headers_too_large (431) or
// unsupported_transfer_encoding (501), the detail is net/http's reason.
func RewritePlainError(reply []byte) ([]byte, bool) {
	// Only the status line is read, and the headers right after it
	// compared: every response's first write passes here.
	rest, ok := bytes.CutPrefix(reply, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	i := bytes.IndexByte(rest, '\r')
	if i < 4 || rest[3] != ' ' || bytes.IndexByte(rest[:i], '\n') >= 0 || !bytes.HasPrefix(rest[i:], []byte(plainErrorHeaders)) {
		return nil, false
	}
	line := rest[:i]
	status, err := strconv.Atoi(string(line[:3]))
	if err != nil {
		return nil, false
	}
	var code, detail string
	switch {
	case status == http.StatusRequestHeaderFieldsTooLarge:
		code, detail = contract.CodeHeadersTooLarge, fmt.Sprintf("The request's headers are larger than %d KiB.", MaxHeaderBytes>>10)
	case status == http.StatusNotImplemented:
		code, detail = contract.CodeUnsupportedTransferEncoding, "The request's Transfer-Encoding is not supported: send the body with Content-Length or chunked."
	case status == http.StatusBadRequest:
		code, detail = contract.CodeBadRequest, "The request is not valid HTTP/1.1."
		// "400 Bad Request: missing required Host header": net/http's
		// reason, which names what is wrong (made valid UTF-8, as a
		// problem's detail must be, should it ever quote the request).
		if _, reason, ok := bytes.Cut(line, []byte(": ")); ok {
			detail = "The request is not valid HTTP/1.1: " + strings.ToValidUTF8(string(reason), "\uFFFD") + "."
		}
	default:
		return nil, false
	}
	doc := problem.New(status, code, detail).JSON()
	out := fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nX-Request-Id: %s\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), problem.ContentType, len(doc), problem.NewRequestID())
	return append(out, doc...), true
}
