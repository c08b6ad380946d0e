package api_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/api"
)

func model(t *testing.T) (libopenapi.Document, *v3.Document) {
	t.Helper()
	doc, err := libopenapi.NewDocument(api.OpenAPI())
	require.NoError(t, err)
	m, err := doc.BuildV3Model()
	require.NoError(t, err, "every $ref resolves and the model builds")
	return doc, &m.Model
}

// The document is OpenAPI 3.1 and valid against the specification's own
// schema.
func TestDocumentIsValidOpenAPI31(t *testing.T) {
	t.Parallel()
	doc, m := model(t)
	require.Equal(t, "3.1.1", m.Version)
	v, errs := validator.NewValidator(doc)
	require.Empty(t, errs)
	ok, verrs := v.ValidateDocument()
	for _, e := range verrs {
		t.Errorf("%s: %s (line %d)", e.Message, e.Reason, e.SpecLine)
		for _, f := range e.SchemaValidationErrors {
			t.Errorf("  %s at %s", f.Reason, f.KeywordLocation)
		}
	}
	require.True(t, ok)
}

// Every operation says what it is for and answers with X-Request-Id; every
// error response is a problem.
func TestEveryOperationIsDescribed(t *testing.T) {
	t.Parallel()
	_, m := model(t)
	for path, item := range m.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			name := strings.ToUpper(method) + " " + path
			require.NotEmpty(t, op.OperationId, name)
			require.NotEmpty(t, op.Summary, name)
			require.NotEmpty(t, op.Tags, name)
			for code, resp := range op.Responses.Codes.FromOldest() {
				require.NotEmpty(t, resp.Description, "%s %s", name, code)
				_, ok := resp.Headers.Get("X-Request-Id")
				require.True(t, ok, "%s %s: every response carries X-Request-Id", name, code)
				if code >= "400" {
					_, ok := resp.Content.Get("application/problem+json")
					require.True(t, ok, "%s %s: an error is application/problem+json", name, code)
					require.Equal(t, 1, resp.Content.Len(), "%s %s", name, code)
				}
			}
		}
	}
}

// The examples in the document are valid against their own schemas.
func TestExamplesMatchTheirSchemas(t *testing.T) {
	t.Parallel()
	_, m := model(t)
	sv := schema_validation.NewSchemaValidator(config.WithFormatAssertions())
	checked := 0
	check := func(where string, mt *v3.MediaType) {
		if mt == nil || mt.Schema == nil {
			return
		}
		for name, ex := range mt.Examples.FromOldest() {
			var v any
			require.NoError(t, ex.Value.Decode(&v), where)
			ok, errs := sv.ValidateSchemaObject(mt.Schema.Schema(), v)
			for _, e := range errs {
				for _, f := range e.SchemaValidationErrors {
					t.Errorf("%s example %q: %s at %s", where, name, f.Reason, f.FieldPath)
				}
			}
			require.True(t, ok, "%s example %q", where, name)
			checked++
		}
	}
	for path, item := range m.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			name := strings.ToUpper(method) + " " + path
			if op.RequestBody != nil {
				for ct, mt := range op.RequestBody.Content.FromOldest() {
					check(name+" request "+ct, mt)
				}
			}
			for code, resp := range op.Responses.Codes.FromOldest() {
				for ct, mt := range resp.Content.FromOldest() {
					check(fmt.Sprintf("%s %s %s", name, code, ct), mt)
				}
			}
		}
	}
	require.Positive(t, checked)
}

func ExampleOpenAPI() {
	doc := api.OpenAPI()
	first, _, _ := bytes.Cut(doc, []byte("\n"))
	fmt.Println(string(first))
	fmt.Println(api.ContentType)
	// Output:
	// openapi: 3.1.1
	// application/yaml
}
