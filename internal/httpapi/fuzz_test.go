package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/webhooks"
	"github.com/quillhq/quill/internal/whsecret"
)

// tokenPlaceholder in a fuzzed request is replaced by a valid token, so
// that the fuzzer reaches the handlers behind authentication.
const tokenPlaceholder = "TOKEN"

// FuzzHTTPRequest feeds whole HTTP/1.1 requests — method, path, headers,
// body — to the real handler over a real database and requires a
// well-formed answer: no panic (which the handler would turn into a 500
// internal_error), a status a client can read, X-Request-Id, and for every
// 4xx and 5xx a problem+json body whose status and retry advice agree.
// `go test` runs the seeds only; `go test -fuzz FuzzHTTPRequest` explores.
func FuzzHTTPRequest(f *testing.F) {
	pool, _ := dbtest.Pool(f, 4)
	svc, err := notes.NewService(pool, notes.Config{}, testkit.Logger(f))
	if err != nil {
		f.Fatal(err)
	}
	keys, err := whsecret.ParseKeys(base64.StdEncoding.EncodeToString(make([]byte, 32)))
	if err != nil {
		f.Fatal(err)
	}
	wh, err := webhooks.NewService(pool, notes.Config{}, keys, testkit.Logger(f))
	if err != nil {
		f.Fatal(err)
	}
	api := httpapi.NewServer(httpapi.Deps{Pool: pool, Notes: svc, Webhooks: wh, Log: testkit.Logger(f),
		Config: httpapi.Config{MaxBodyBytes: 64 << 10, MaxAttachmentBytes: 32 << 10}})
	tok, err := auth.Create(context.Background(), pool, "fuzz-"+strings.ToLower(uuid.NewString()[:8]), time.Now())
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		"POST /v1/notes HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"title\":\"hello\"}",
		"POST /v1/notes HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\nIdempotency-Key: \"k2\"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"tit\r\n0\r\n\r\n",
		"POST /v1/notes HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\nIdempotency-Key: k3\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi",
		"GET /v1/notes?limit=2&cursor=AAAAAAAAAAAAAAAAAAAAAA HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\n\r\n",
		"DELETE /v1/notes/0190a6f5-0000-7000-8000-000000000000 HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\nIdempotency-Key: d1\r\nPrefer: wait=0\r\n\r\n",
		"GET /v1/operations/%2e%2e%2F%ZZ HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\n\r\n",
		"HEAD /v1/notes/not-a-uuid/attachment/thumbnail HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer qt_00000000_x\r\nX-Request-Id: ../..\r\n\r\n",
		"PATCH /openapi.yaml HTTP/1.1\r\nHost: q\r\ntraceparent: 00-zz\r\n\r\n",
		"POST /v1/webhooks HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\nIdempotency-Key: w1\r\nContent-Type: application/json\r\nContent-Length: 69\r\n\r\n{\"url\":\"https://[fe80::1%25x]/\",\"event_types\":[\"quill.note.created.v1\"]}",
		"POST /v1/webhooks/0190a6f5-0000-7000-8000-000000000000/rotate-secret HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\nIdempotency-Key: w2\r\n\r\n",
		"GET /v1/webhooks HTTP/1.1\r\nHost: q\r\nAuthorization: Bearer TOKEN\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	problemFields := []string{"type", "title", "status", "detail", "code", "retry"}
	f.Fuzz(func(t *testing.T, raw []byte) {
		raw = bytes.ReplaceAll(raw, []byte(tokenPlaceholder), []byte(tok))
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return // not a request net/http's server would hand to a handler
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, r.WithContext(ctx))
		res := rec.Result()
		if res.StatusCode < 200 || res.StatusCode > 599 {
			t.Fatalf("status %d", res.StatusCode)
		}
		if res.Header.Get("X-Request-Id") == "" {
			t.Fatalf("%d without X-Request-Id", res.StatusCode)
		}
		if res.StatusCode == http.StatusInternalServerError {
			t.Fatalf("500 (a panic or an unexpected error): %s", rec.Body.Bytes())
		}
		if res.StatusCode < 400 || r.Method == http.MethodHead {
			return
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("%d as %q: %s", res.StatusCode, ct, rec.Body.Bytes())
		}
		var p map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%d: not JSON: %v: %s", res.StatusCode, err, rec.Body.Bytes())
		}
		for _, k := range problemFields {
			if _, ok := p[k]; !ok {
				t.Fatalf("%d: problem without %q: %s", res.StatusCode, k, rec.Body.Bytes())
			}
		}
		if st, _ := p["status"].(float64); int(st) != res.StatusCode {
			t.Fatalf("problem status %v on a %d", p["status"], res.StatusCode)
		}
		if !slices.Contains([]string{"same_key", "after_fixing", "no"}, p["retry"].(string)) {
			t.Fatalf("retry %q", p["retry"])
		}
	})
}
