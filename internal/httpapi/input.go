package httpapi

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/problem"
)

// strict rejects unknown members; duplicate member names and invalid UTF-8
// are rejected by json v2's defaults, trailing data by Unmarshal.
var strict = json.RejectUnknownMembers(true)

// isJSON reports whether a Content-Type names JSON: application/json or a
// +json suffix type.
func isJSON(contentType string) bool {
	if contentType == "application/json" {
		return true // what nearly every client sends, without parsing it
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// decodeBody decodes the request body, which must be exactly one JSON object
// of at most limit bytes, into dst. The limit is enforced while reading.
// A create's body of the shape clients send is decoded by decodeCreate,
// without reflection (issue 29); any other, and anything decodeCreate
// does not take, by json v2, whose answer is the contract.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, dst any) *problem.Problem {
	if r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
		return problem.New(http.StatusBadRequest, contract.CodeInvalidJSON, "the body is empty; send one JSON object")
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		return problem.New(http.StatusUnsupportedMediaType, contract.CodeUnsupportedMedia,
			"send the body as JSON with Content-Type: application/json")
	}
	if r.ContentLength > limit {
		return tooLarge(limit)
	}
	buf := bodies.Get().(*body)
	defer buf.put()
	if err := buf.read(http.MaxBytesReader(w, r.Body, limit), r.ContentLength); err != nil {
		return decodeProblem(err, limit)
	}
	b := buf.b
	if in, ok := dst.(*notes.CreateInput); ok {
		var taken bool
		if buf.text, taken = decodeCreate(b, buf.text, in); taken {
			return nil
		}
	}
	if p := expectObject(b); p != nil {
		return p
	}
	if err := json.Unmarshal(b, dst, strict); err != nil {
		return decodeProblem(err, limit)
	}
	return nil
}

// body is a request body read whole, in a buffer kept from one request
// to the next (bodies pools them) unless it grew past maxKeptBody, and
// decodeCreate's buffer for the strings it decodes.
type body struct{ b, text []byte }

// bodies are decodeBody's buffers: a body's buffer made anew per request
// was a fifth of the bytes a create allocated (issue 18).
var bodies = sync.Pool{New: func() any { return &body{b: make([]byte, 0, 1024), text: make([]byte, 0, 512)} }}

// maxKeptBody bounds the buffers bodies keeps: one large attachment must
// not pin its size for every later request.
const maxKeptBody = 64 << 10

// read reads r to its end into buf.b; length is the body's declared
// length, -1 when unknown. It returns r's error (the limit's among them).
func (buf *body) read(r io.Reader, length int64) error {
	b := buf.b[:0]
	if length > 0 && int64(cap(b)) <= length {
		b = slices.Grow(b, int(length)+1) // +1: room to read the end
	}
	for {
		if len(b) == cap(b) {
			b = slices.Grow(b, 1)
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			buf.b = b
			return nil
		}
		if err != nil {
			buf.b = b
			return err
		}
	}
}

// put gives buf back to bodies.
func (buf *body) put() {
	if cap(buf.b) > maxKeptBody || cap(buf.text) > maxKeptBody {
		return
	}
	buf.b, buf.text = buf.b[:0], buf.text[:0]
	bodies.Put(buf)
}

// expectObject insists that b, past leading whitespace, starts with '{':
// json v2 would accept a top-level null as "no members".
func expectObject(b []byte) *problem.Problem {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return nil
		default:
			return problem.New(http.StatusBadRequest, contract.CodeInvalidJSON, "the body must be one JSON object")
		}
	}
	return problem.New(http.StatusBadRequest, contract.CodeInvalidJSON, "the body is empty; send one JSON object")
}

func tooLarge(limit int64) *problem.Problem {
	return problem.New(http.StatusRequestEntityTooLarge, contract.CodeTooLarge,
		fmt.Sprintf("the request body is larger than %d bytes", limit))
}

func decodeProblem(err error, limit int64) *problem.Problem {
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return tooLarge(limit)
	}
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "json: ")
	msg = strings.TrimPrefix(msg, "jsontext: ")
	return problem.New(http.StatusBadRequest, contract.CodeInvalidJSON, "the body is not one valid JSON object of the expected shape: "+msg)
}

// preferWait returns the wait a client asked for with Prefer: wait=N
// (RFC 7240), or -1 when it asked for none.
func preferWait(r *http.Request) time.Duration {
	for _, v := range r.Header.Values("Prefer") {
		for pref := range strings.SplitSeq(v, ",") {
			pref, _, _ = strings.Cut(pref, ";") // drop preference parameters
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`))
			if err != nil || n < 0 {
				continue
			}
			return time.Duration(min(n, 3600)) * time.Second
		}
	}
	return -1
}

var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// traceparent returns a valid W3C traceparent header, or "".
func traceparent(r *http.Request) string {
	tp := r.Header.Get("Traceparent")
	if len(tp) != len("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") {
		return "" // most requests send none: the pattern is not run for them
	}
	if !traceparentRE.MatchString(tp) || tp[:2] == "ff" ||
		tp[3:35] == "00000000000000000000000000000000" || tp[36:52] == "0000000000000000" {
		return "" // invalid per W3C Trace Context §3.2
	}
	return tp
}

// maxVersion is the largest note version (PostgreSQL's integer).
const maxVersion = 1<<31 - 1

// ifMatch reads the If-Match header: the note version it names, 0 when
// there is none, or the problem of a header that names no single version.
// Quill's ETags are strong quoted versions ("3"); "*", a weak tag, a list
// or an unquoted number are refused rather than guessed at, since an
// update applied against the wrong version would overwrite someone's edit.
func ifMatch(r *http.Request) (int, *problem.Problem) {
	values := r.Header.Values("If-Match")
	if len(values) == 0 {
		return 0, nil
	}
	v, err := parseIfMatch(values)
	if err != nil {
		p := problem.New(http.StatusBadRequest, contract.CodeValidation, "the request has invalid fields; see errors")
		p.Errors = []problem.FieldError{{Field: "If-Match", Message: err.Error()}}
		return 0, p
	}
	return v, nil
}

// parseIfMatch returns the version that the If-Match field values name:
// exactly one strong entity tag of a decimal version, 1 to 2^31-1, without
// leading zeros.
func parseIfMatch(values []string) (int, error) {
	if len(values) != 1 {
		return 0, errors.New(`send one If-Match header with one version, e.g. If-Match: "3"`)
	}
	v := strings.Trim(values[0], " \t")
	if v == "*" {
		return 0, errors.New(`"*" is not accepted: name the version you read, e.g. If-Match: "3"`)
	}
	if strings.HasPrefix(v, "W/") {
		return 0, errors.New(`a weak entity tag is not accepted: name the version as ETag gave it, e.g. If-Match: "3"`)
	}
	digits, ok := strings.CutPrefix(v, `"`)
	if ok {
		digits, ok = strings.CutSuffix(digits, `"`)
	}
	if !ok || digits == "" || len(digits) > 10 || digits[0] == '0' || strings.Trim(digits, "0123456789") != "" {
		return 0, errors.New(`must be one version in quotes as ETag gives it, e.g. If-Match: "3"`)
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n > maxVersion {
		return 0, errors.New(`names no version a note can have`)
	}
	return n, nil
}
