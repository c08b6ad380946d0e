package httpapi

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/problem"
)

// newBodyRequest returns a POST with body; a negative length hides the
// body's length (chunked transfer), as a server sees it.
func newBodyRequest(contentType string, body []byte, length int64) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/notes", bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	if length < 0 {
		r.Body = io.NopCloser(bytes.NewReader(body)) // no Len(): unknown length
		r.ContentLength = -1
		r.TransferEncoding = []string{"chunked"}
	}
	return r
}

func decode(contentType, body string, limit int64, chunked bool) (notes.CreateInput, *problem.Problem) {
	length := int64(len(body))
	if chunked {
		length = -1
	}
	var in notes.CreateInput
	p := decodeBody(httptest.NewRecorder(), newBodyRequest(contentType, []byte(body), length), limit, &in)
	return in, p
}

func TestDecodeBodyValid(t *testing.T) {
	t.Parallel()
	const full = `{"title":"Groceries","body":"milk","attachment":{"filename":"a.txt","content_type":"text/plain","data":"QQ=="}}`
	for _, chunked := range []bool{false, true} {
		in, p := decode("application/json", full, 1024, chunked)
		require.Nil(t, p)
		require.Equal(t, "Groceries", *in.Title)
		require.Equal(t, "milk", *in.Body)
		require.NotNil(t, in.Attachment)
		require.Equal(t, "a.txt", *in.Attachment.Filename)
		require.Equal(t, "text/plain", *in.Attachment.ContentType)
		require.Equal(t, "QQ==", *in.Attachment.Data)
	}

	tests := []struct {
		name  string
		body  string
		check func(t *testing.T, in notes.CreateInput)
	}{
		{name: "empty object", body: `{}`, check: func(t *testing.T, in notes.CreateInput) {
			require.Equal(t, notes.CreateInput{}, in)
		}},
		{name: "whitespace around", body: " \t\r\n{\"title\":\"t\"} \n", check: func(t *testing.T, in notes.CreateInput) {
			require.Equal(t, "t", *in.Title)
		}},
		{name: "null members are absent", body: `{"title":null,"body":null,"attachment":null}`, check: func(t *testing.T, in notes.CreateInput) {
			require.Equal(t, notes.CreateInput{}, in)
		}},
		{name: "empty string is present", body: `{"title":""}`, check: func(t *testing.T, in notes.CreateInput) {
			require.NotNil(t, in.Title)
			require.Empty(t, *in.Title)
		}},
		{name: "escapes decoded, nothing normalised", body: `{"title":"Cafe\u0301 \"q\" \u00e9 😀  "}`, check: func(t *testing.T, in notes.CreateInput) {
			require.Equal(t, "Cafe\u0301 \"q\" \u00e9 😀  ", *in.Title)
		}},
		{name: "NUL escape reaches validation", body: `{"body":"a\u0000b"}`, check: func(t *testing.T, in notes.CreateInput) {
			require.Equal(t, "a\x00b", *in.Body)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in, p := decode("application/json", tt.body, 1024, false)
			require.Nil(t, p, "problem: %+v", p)
			tt.check(t, in)
		})
	}
}

func TestDecodeBodyContentType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		contentType string
		ok          bool
	}{
		{"application/json", true},
		{"application/json; charset=utf-8", true},
		{"application/json;charset=UTF-8", true},
		{"Application/JSON", true},
		{"application/merge-patch+json", true},
		{"application/vnd.quill+json", true},
		{"", false},
		{"text/plain", false},
		{"text/plain; charset=utf-8", false},
		{"application/x-www-form-urlencoded", false},
		{"multipart/form-data; boundary=x", false},
		{"application/jsonx", false},
		{"application/json-patch", false},
		{"json", false},
		{"application/json; charset", false}, // malformed parameter
		{"text/plain+json", false},
	}
	for _, tt := range tests {
		t.Run(tt.contentType, func(t *testing.T) {
			t.Parallel()
			_, p := decode(tt.contentType, `{"title":"t"}`, 1024, false)
			if tt.ok {
				require.Nil(t, p, "problem: %+v", p)
				return
			}
			require.NotNil(t, p)
			require.Equal(t, http.StatusUnsupportedMediaType, p.Status)
			require.Equal(t, contract.CodeUnsupportedMedia, p.Code)
			require.Equal(t, contract.RetryAfterFixing, p.Retry)
		})
	}
}

func TestDecodeBodyInvalidJSON(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, body string }{
		{"top-level null", `null`},
		{"top-level array", `[]`},
		{"top-level array of object", `[{"title":"t"}]`},
		{"top-level string", `"title"`},
		{"top-level number", `1`},
		{"top-level true", `true`},
		{"empty body", ``},
		{"whitespace only", " \n\t "},
		{"two objects", `{} {}`},
		{"two objects no space", `{}{}`},
		{"trailing garbage", `{}x`},
		{"trailing brace", `{}}`},
		{"trailing comma", `{"title":"t",}`},
		{"unterminated", `{"title":"t"`},
		{"missing value", `{"title":}`},
		{"single quotes", `{'title':'t'}`},
		{"comment", `{/* c */"title":"t"}`},
		{"BOM", "\ufeff{}"},
		{"duplicate member", `{"title":"a","title":"b"}`},
		{"duplicate member same value", `{"title":"a","title":"a"}`},
		{"duplicate nested member", `{"attachment":{"data":"QQ==","data":"QQ=="}}`},
		{"duplicate via escape", `{"title":"a","\u0074itle":"b"}`},
		{"unknown member", `{"titel":"t"}`},
		{"unknown member case variant", `{"Title":"t"}`},
		{"unknown nested member", `{"attachment":{"filename":"a","size":1}}`},
		{"unknown member null", `{"tenant":null}`},
		{"title number", `{"title":1}`},
		{"title bool", `{"title":true}`},
		{"title array", `{"title":["t"]}`},
		{"title object", `{"title":{}}`},
		{"body number", `{"body":0}`},
		{"attachment string", `{"attachment":"QQ=="}`},
		{"attachment array", `{"attachment":[]}`},
		{"data number", `{"attachment":{"data":1}}`},
		{"invalid UTF-8 in string", "{\"title\":\"a\xffb\"}"},
		{"overlong UTF-8 in string", "{\"title\":\"\xc0\xaf\"}"},
		{"UTF-16 surrogate bytes in string", "{\"title\":\"\xed\xa0\x80\"}"},
		{"invalid UTF-8 in member name", "{\"\xff\":1}"},
		{"lone surrogate escape", `{"title":"\ud800"}`},
		{"bad escape", `{"title":"\x"}`},
		{"raw control char in string", "{\"title\":\"a\nb\"}"},
		{"NaN", `{"title":NaN}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, chunked := range []bool{false, true} {
				_, p := decode("application/json", tt.body, 1024, chunked)
				require.NotNil(t, p, "body %q accepted (chunked=%v)", tt.body, chunked)
				require.Equal(t, http.StatusBadRequest, p.Status, "chunked=%v: %+v", chunked, p)
				require.Equal(t, contract.CodeInvalidJSON, p.Code)
				require.Equal(t, contract.RetryAfterFixing, p.Retry)
				require.NotEmpty(t, p.Detail)
			}
		})
	}
}

func TestDecodeBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 64
	// Objects of exactly n bytes.
	object := func(n int) string {
		s := `{"title":"` + strings.Repeat("a", n-len(`{"title":""}`)) + `"}`
		require.Len(t, s, n)
		return s
	}
	tests := []struct {
		name string
		body string
		ok   bool
	}{
		{name: "one below the limit", body: object(limit - 1), ok: true},
		{name: "at the limit", body: object(limit), ok: true},
		{name: "one over the limit", body: object(limit + 1)},
		{name: "far over the limit", body: object(10 * limit)},
		{name: "over the limit in trailing whitespace", body: object(limit-1) + strings.Repeat(" ", 2)},
		{name: "over the limit in leading whitespace", body: strings.Repeat(" ", limit+1) + `{}`},
		{name: "over the limit in an unterminated string", body: `{"title":"` + strings.Repeat("a", 2*limit)},
		{name: "over the limit with a large string", body: object(5000)},
	}
	for _, tt := range tests {
		for _, chunked := range []bool{false, true} {
			name := tt.name + " (Content-Length)"
			if chunked {
				name = tt.name + " (unknown length)"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				in, p := decode("application/json", tt.body, limit, chunked)
				if tt.ok {
					require.Nil(t, p, "problem: %+v", p)
					require.NotNil(t, in.Title)
					return
				}
				require.NotNil(t, p)
				require.Equal(t, http.StatusRequestEntityTooLarge, p.Status, "%+v", p)
				require.Equal(t, contract.CodeTooLarge, p.Code)
				require.Equal(t, contract.RetryAfterFixing, p.Retry)
			})
		}
	}
}

// A Content-Length over the limit is refused before any byte is read.
func TestDecodeBodyContentLengthOverLimitReadsNothing(t *testing.T) {
	t.Parallel()
	body := &countingReader{r: strings.NewReader(`{"title":"t"}`)}
	r := httptest.NewRequest(http.MethodPost, "/v1/notes", body)
	r.Header.Set("Content-Type", "application/json")
	r.ContentLength = 1 << 30
	var in notes.CreateInput
	p := decodeBody(httptest.NewRecorder(), r, 1024, &in)
	require.NotNil(t, p)
	require.Equal(t, http.StatusRequestEntityTooLarge, p.Status)
	require.Equal(t, contract.CodeTooLarge, p.Code)
	require.Zero(t, body.n)
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A delete's body is decoded into an empty struct: only {} passes.
func TestDecodeBodyEmptyStruct(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body string
		ok   bool
	}{
		{`{}`, true},
		{` { } `, true},
		{`{"id":"x"}`, false},
		{`null`, false},
		{`[]`, false},
	}
	for _, tt := range tests {
		var empty struct{}
		p := decodeBody(httptest.NewRecorder(), newBodyRequest("application/json", []byte(tt.body), int64(len(tt.body))), 1024, &empty)
		if tt.ok {
			require.Nil(t, p, "body %q", tt.body)
			continue
		}
		require.NotNil(t, p, "body %q", tt.body)
		require.Equal(t, contract.CodeInvalidJSON, p.Code)
	}
}

func TestPreferWait(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		prefer []string
		want   time.Duration
	}{
		{name: "absent", prefer: nil, want: -1},
		{name: "wait", prefer: []string{"wait=5"}, want: 5 * time.Second},
		{name: "wait zero", prefer: []string{"wait=0"}, want: 0},
		{name: "with respond-async", prefer: []string{"respond-async, wait=3"}, want: 3 * time.Second},
		{name: "wait first", prefer: []string{"wait=4, respond-async"}, want: 4 * time.Second},
		{name: "second header line", prefer: []string{"respond-async", "wait=7"}, want: 7 * time.Second},
		{name: "case-insensitive name", prefer: []string{"WAIT=2"}, want: 2 * time.Second},
		{name: "quoted value", prefer: []string{`wait="6"`}, want: 6 * time.Second},
		{name: "spaces around", prefer: []string{"  wait = 8 "}, want: 8 * time.Second},
		{name: "not a number", prefer: []string{"wait=abc"}, want: -1},
		{name: "bad then good", prefer: []string{"wait=abc, wait=1"}, want: time.Second},
		{name: "fraction", prefer: []string{"wait=1.5"}, want: -1},
		{name: "negative", prefer: []string{"wait=-1"}, want: -1},
		{name: "empty value", prefer: []string{"wait="}, want: -1},
		{name: "no value", prefer: []string{"wait"}, want: -1},
		{name: "other preference", prefer: []string{"return=minimal"}, want: -1},
		{name: "name with suffix", prefer: []string{"waiting=5"}, want: -1},
		{name: "capped", prefer: []string{"wait=999999"}, want: time.Hour},
		{name: "overflow", prefer: []string{"wait=99999999999999999999999"}, want: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodPost, "/v1/notes", nil)
			for _, v := range tt.prefer {
				r.Header.Add("Prefer", v)
			}
			require.Equal(t, tt.want, preferWait(r))
		})
	}
}

func TestTraceparent(t *testing.T) {
	t.Parallel()
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tests := []struct {
		name   string
		header []string
		want   string
	}{
		{name: "valid", header: []string{valid}, want: valid},
		{name: "valid unsampled", header: []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}, want: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"},
		{name: "absent", header: nil, want: ""},
		{name: "empty", header: []string{""}, want: ""},
		{name: "uppercase hex", header: []string{strings.ToUpper(valid)}, want: ""},
		{name: "short trace id", header: []string{"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"}, want: ""},
		{name: "long parent id", header: []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b70-01"}, want: ""},
		{name: "non-hex", header: []string{"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01"}, want: ""},
		{name: "missing flags", header: []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}, want: ""},
		{name: "leading space", header: []string{" " + valid}, want: ""},
		{name: "trailing data", header: []string{valid + "-extra"}, want: ""},
		{name: "trailing newline", header: []string{valid + "\n"}, want: ""},
		{name: "underscores", header: []string{"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01"}, want: ""},
		{name: "first of repeated headers", header: []string{valid, "garbage"}, want: valid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodPost, "/v1/notes", nil)
			for _, v := range tt.header {
				r.Header.Add("traceparent", v)
			}
			require.Equal(t, tt.want, traceparent(r))
		})
	}
}

// W3C Trace Context §3.2: version ff, an all-zero trace-id and an all-zero
// parent-id are invalid, and a vendor must ignore such a traceparent.
func TestTraceparentRejectsW3CInvalidValues(t *testing.T) {
	t.Parallel()
	for _, v := range []string{
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/notes", nil)
		r.Header.Set("traceparent", v)
		require.Empty(t, traceparent(r), v)
	}
}

func FuzzDecodeBody(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"title":"t","body":"b","attachment":{"filename":"f","content_type":"text/plain","data":"QQ=="}}`,
		`null`, `[]`, `""`, `1`, ``, ` `, `{} {}`, `{}x`, `{"title":"a","title":"b"}`, `{"x":1}`,
		`{"title":1}`, "{\"title\":\"\xff\"}", `{"title":"\ud800"}`, strings.Repeat(" ", 200) + `{}`,
		`{"title":"` + strings.Repeat("a", 300) + `"}`, "\ufeff{}", `{"attachment":{"size":1}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	const limit = 256
	f.Fuzz(func(t *testing.T, body []byte, chunked bool) {
		length := int64(len(body))
		if chunked {
			length = -1
		}
		var in notes.CreateInput
		p := decodeBody(httptest.NewRecorder(), newBodyRequest("application/json", body, length), limit, &in)
		if p == nil {
			require.LessOrEqual(t, len(body), limit, "a body over the limit was accepted")
			require.True(t, jsontext.Value(body).IsValid(), "an invalid JSON body was accepted: %q", body)
			trimmed := bytes.TrimLeft(body, " \t\r\n")
			require.True(t, len(trimmed) > 0 && trimmed[0] == '{', "a non-object was accepted: %q", body)
			return
		}
		switch p.Status {
		case http.StatusBadRequest:
			require.Equal(t, contract.CodeInvalidJSON, p.Code)
		case http.StatusRequestEntityTooLarge:
			require.Equal(t, contract.CodeTooLarge, p.Code)
			require.Greater(t, len(body), limit, "a body within the limit was called too large")
		default:
			t.Fatalf("unexpected problem %d %s for body %q", p.Status, p.Code, body)
		}
		if !chunked && len(body) > limit {
			require.Equal(t, http.StatusRequestEntityTooLarge, p.Status)
		}
		require.Equal(t, contract.RetryAfterFixing, p.Retry)
	})
}

func TestValidRequestID(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		id   string
		want bool
	}{
		{"", false},
		{"a", true},
		{"req-1.2_3", true},
		{strings.Repeat("x", 128), true},
		{strings.Repeat("x", 129), false},
		{"with space", false},
		{"semi;colon", false},
		{"é", false},
		{"new\nline", false},
		{"ABCxyz019", true},
	} {
		require.Equal(t, c.want, validRequestID(c.id), "%q", c.id)
	}
}
