package api

import (
	"bytes"
	_ "embed" // the document
)

//go:embed asyncapi.yaml
var asyncAPI []byte

// AsyncAPI returns the AsyncAPI 3.0 document of Quill's event stream
// (api/asyncapi.yaml), as YAML, to be served with ContentType. Its payloads
// refer to the schemas of the events' data by relative references
// (schemas/<type>.json), which resolve both beside the file in the
// repository and, for a document fetched from the API at /asyncapi.yaml, to
// the API's /schemas/<type>.json. Each call returns a new copy, which the
// caller may modify.
func AsyncAPI() []byte { return bytes.Clone(asyncAPI) }
