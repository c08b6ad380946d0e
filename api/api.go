// Package api holds the OpenAPI 3.1 document of Quill's HTTP API
// (api/openapi.yaml) and the JSON Schema of each event's data
// (api/schemas), embedded so that the API serves, and its tests check the
// handlers and the events against, exactly the reviewed files.
package api

import (
	"bytes"
	_ "embed" // the document
)

//go:embed openapi.yaml
var openAPI []byte

// ContentType is the media type the document is served with: YAML, as
// registered by RFC 9512. (application/openapi+yaml is still an
// Internet-Draft, not a registered type.)
const ContentType = "application/yaml"

// OpenAPI returns the OpenAPI 3.1 document of the HTTP API, as YAML. Each call
// returns a new copy, which the caller may modify.
func OpenAPI() []byte { return bytes.Clone(openAPI) }
