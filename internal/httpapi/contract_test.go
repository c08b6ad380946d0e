package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	liberrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"github.com/quillhq/quill/api"
)

// offContractHeader marks a request that deliberately breaks the API's
// contract — bad JSON, a missing or malformed key, no token, an unknown path:
// the contract check does not validate such a request against the OpenAPI
// document, only the answer it gets. Its value says why. The check removes
// it before the API sees the request.
const offContractHeader = "X-Test-Off-Contract"

// contract checks every request the tests send, and every answer the API
// gives, against api/openapi.yaml: path, method, parameters, headers and
// bodies, in strict mode (an undeclared member, header or query parameter is
// a failure) with formats asserted (uuid, date-time).
type apiContract struct {
	model   *v3.Document
	v       validator.Validator
	schemas schema_validation.SchemaValidator
	// mu serialises validation: libopenapi renders and caches schemas
	// lazily without locking (a data race under -race when parallel tests'
	// requests are validated at once), so one validation runs at a time.
	mu sync.Mutex
}

var loadContract = sync.OnceValues(func() (*apiContract, error) {
	doc, err := libopenapi.NewDocument(api.OpenAPI())
	if err != nil {
		return nil, fmt.Errorf("parse api/openapi.yaml: %w", err)
	}
	m, err := doc.BuildV3Model()
	if err != nil {
		return nil, fmt.Errorf("build api/openapi.yaml: %w", err)
	}
	opts := []config.Option{config.WithFormatAssertions(), config.WithStrictMode()}
	v := validator.NewValidatorFromV3Model(&m.Model, opts...)
	return &apiContract{model: &m.Model, v: v, schemas: schema_validation.NewSchemaValidator(opts...)}, nil
})

func contractFor(t *testing.T) *apiContract {
	t.Helper()
	c, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// operation finds the documented operation of r: the path template whose
// segments match r's escaped path (a {param} matches one segment) and the
// operation of r's method (HEAD is served as GET). known reports whether
// the path is documented at all.
func (c *apiContract) operation(r *http.Request) (template string, op *v3.Operation, known bool) {
	segs := strings.Split(r.URL.EscapedPath(), "/")
	for tmpl, item := range c.model.Paths.PathItems.FromOldest() {
		tsegs := strings.Split(tmpl, "/")
		if len(tsegs) != len(segs) {
			continue
		}
		match := true
		for i, ts := range tsegs {
			if strings.HasPrefix(ts, "{") && strings.HasSuffix(ts, "}") {
				match = match && segs[i] != ""
				continue
			}
			match = match && ts == segs[i]
		}
		if !match {
			continue
		}
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet
		}
		op, _ := item.GetOperations().Get(strings.ToLower(method))
		return tmpl, op, true
	}
	return "", nil, false
}

// recorder passes a response through and keeps a copy of it.
type recorder struct {
	http.ResponseWriter
	status int
	header http.Header
	body   bytes.Buffer
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.header = w.ResponseWriter.Header().Clone()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (a test that
// drops the response hijacks it).
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serve runs next for r and fails t when r (unless marked off-contract) or
// the answer disagrees with the document.
func (c *apiContract) serve(t *testing.T, next http.Handler, w http.ResponseWriter, r *http.Request) {
	offContract := r.Header.Get(offContractHeader)
	r.Header.Del(offContractHeader)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// The client went away while sending: nothing to check, and
		// the API sees the same failure reading the rest.
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
		next.ServeHTTP(w, r)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	// What the validator reads: a copy, detached from the request's fate.
	vr := r.Clone(context.WithoutCancel(r.Context()))
	vr.Body = io.NopCloser(bytes.NewReader(body))
	name := r.Method + " " + r.URL.RequestURI()

	tmpl, op, known := c.operation(r)
	documented := op != nil
	switch {
	case offContract != "":
	case !documented:
		t.Errorf("contract: %s is not in api/openapi.yaml (mark the request with %s if it is meant to be off the contract)", name, offContractHeader)
	default:
		if ok, errs := c.validateRequest(vr); !ok {
			t.Errorf("contract: request %s does not match api/openapi.yaml (%s):%s", name, tmpl, describe(errs))
		}
	}

	rec := &recorder{ResponseWriter: w}
	next.ServeHTTP(rec, r)
	if rec.status == 0 {
		return // nothing was answered: the test took the connection over
	}
	if r.Method == http.MethodHead {
		return // no body to check against the GET's
	}
	vr.Body = io.NopCloser(bytes.NewReader(body))
	res := &http.Response{
		StatusCode: rec.status, Header: rec.header, Request: vr,
		Body: io.NopCloser(bytes.NewReader(rec.body.Bytes())), ContentLength: int64(rec.body.Len()),
	}
	answer := fmt.Sprintf("%d %s", rec.status, truncate(rec.body.Bytes(), 600))
	if !documented {
		// Outside the document the API answers 404 (unknown path) or
		// 405 (a method the path does not serve), as problems.
		want, schema := http.StatusNotFound, "NotFoundProblem"
		if known {
			want, schema = http.StatusMethodNotAllowed, "MethodNotAllowedProblem"
			if rec.header.Get("Allow") == "" {
				t.Errorf("contract: %s: 405 without Allow", name)
			}
		}
		if rec.status != want || rec.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("contract: %s is off the document: want a %d problem, got %s", name, want, answer)
			return
		}
		if ok, errs := c.validateSchema(schema, rec.body.Bytes()); !ok {
			t.Errorf("contract: %s: answer %s does not match %s:%s", name, answer, schema, describe(errs))
		}
		return
	}
	if ok, errs := c.validateResponse(vr, res); !ok {
		t.Errorf("contract: %s: answer %s does not match api/openapi.yaml (%s):%s", name, answer, tmpl, describe(errs))
	}
}

func (c *apiContract) validateRequest(r *http.Request) (bool, []*liberrors.ValidationError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v.ValidateHttpRequestSync(r)
}

func (c *apiContract) validateResponse(r *http.Request, res *http.Response) (bool, []*liberrors.ValidationError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v.ValidateHttpResponse(r, res)
}

func (c *apiContract) validateSchema(name string, body []byte) (bool, []*liberrors.ValidationError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.schemas.ValidateSchemaBytes(c.schema(name), body)
}

func (c *apiContract) schema(name string) *base.Schema {
	return c.model.Components.Schemas.GetOrZero(name).Schema()
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func describe(errs []*liberrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  %s: %s", e.Message, e.Reason)
		for _, f := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n    %s (at %s; schema %s)", f.Reason, f.FieldPath, f.KeywordLocation)
		}
	}
	return b.String()
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
