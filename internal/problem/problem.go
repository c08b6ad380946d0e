// Package problem builds Quill's RFC 9457 problem details: every error the
// HTTP API answers, with a stable code and the retry advice an agent acts on
// (both named in package contract).
package problem

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"strconv"

	"github.com/go-json-experiment/json"

	"github.com/quillhq/quill/contract"
)

// ContentType is the media type of a problem body.
const ContentType = "application/problem+json"

// FieldError names one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Problem is one RFC 9457 problem document.
type Problem struct {
	Type     string       `json:"type"`
	Title    string       `json:"title"`
	Status   int          `json:"status"`
	Detail   string       `json:"detail"`
	Code     string       `json:"code"`
	Retry    string       `json:"retry"`
	Errors   []FieldError `json:"errors,omitempty"`
	Fields   []string     `json:"fields,omitempty"`
	Resource string       `json:"resource,omitempty"`
	// CurrentVersion is the note's version when If-Match named another
	// (precondition_failed).
	CurrentVersion int `json:"current_version,omitzero"`
	// RetryAfter, in seconds, is sent as the Retry-After header when > 0.
	RetryAfter int `json:"-"`
}

// New returns the problem for code with status and detail; type, title and
// retry advice follow from the code.
func New(status int, code, detail string) *Problem {
	return &Problem{
		Type:   "urn:quill:problem:" + code,
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code,
		Retry:  retryFor(status, code),
	}
}

// retryFor is SPEC §3's retry advice of a problem.
func retryFor(status int, code string) string {
	switch {
	case code == contract.CodeOpNotFound:
		return contract.RetrySameKey
	case code == contract.CodeWebhooksNotConfigured:
		// A 503 an operator ends, not time: retrying changes nothing.
		return contract.RetryNo
	case code == contract.CodeBadRequest, code == contract.CodeHeadersTooLarge, code == contract.CodeUnsupportedTransferEncoding:
		return contract.RetryAfterFixing
	case status == http.StatusConflict, status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable, status >= 500:
		return contract.RetrySameKey
	case status == http.StatusBadRequest, status == http.StatusUnauthorized,
		status == http.StatusRequestEntityTooLarge, status == http.StatusUnsupportedMediaType,
		status == http.StatusMethodNotAllowed, status == http.StatusPreconditionRequired:
		return contract.RetryAfterFixing
	default:
		return contract.RetryNo
	}
}

// NewRequestID returns a new X-Request-Id value: 24 random hex digits.
// They come from math/rand/v2's generator, which the runtime seeds from
// the system's entropy and keeps per thread: an id names a request in
// logs and answers and guards nothing, and crypto/rand's system call was
// 1 % of a create's CPU (issue 29).
func NewRequestID() string {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint32(b[8:], rand.Uint32())
	var dst [24]byte
	hex.Encode(dst[:], b[:])
	return string(dst[:])
}

// JSON returns the problem's body. Marshaling a Problem cannot fail.
func (p *Problem) JSON() []byte {
	b, err := json.Marshal(p, json.Deterministic(true))
	if err != nil {
		panic("problem: marshal: " + err.Error()) // unreachable: only strings and ints
	}
	return b
}

// Write sends p as the response, with Retry-After when set.
func (p *Problem) Write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", ContentType)
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="quill"`)
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.JSON())
}
