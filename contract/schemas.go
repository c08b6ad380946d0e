package contract

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// schemaFS holds the JSON Schema (2020-12) of each event type's data, one
// file per CloudEvents type: schemas/<type>.json. They live here, with the
// types they describe, so that a consumer validating events needs this
// module only; the API serves the same bytes at /schemas/<type>.json, and
// the AsyncAPI document refers to them as api/schemas (a link here).
//
//go:embed schemas/*.json
var schemaFS embed.FS

// SchemaContentType is the media type the schemas are served with (the
// JSON Schema specification's own, 2020-12 §14.1).
const SchemaContentType = "application/schema+json"

// ErrUnknownSchema is returned for an event type that has no schema.
var ErrUnknownSchema = errors.New("no schema for this event type")

// Schema returns the JSON Schema of the data of the events of CloudEvents
// type typ (e.g. quill.note.created.v1): the file embedded from
// schemas/<typ>.json, byte for byte, as a copy the caller may modify. It
// returns ErrUnknownSchema when there is no such type.
func Schema(typ string) ([]byte, error) {
	// A name with a separator or a dot-dot is no type; refusing it keeps
	// the lookup inside the schemas directory whatever a caller passes.
	if typ == "" || strings.ContainsAny(typ, `/\`) || strings.Contains(typ, "..") {
		return nil, fmt.Errorf("%q: %w", typ, ErrUnknownSchema)
	}
	b, err := schemaFS.ReadFile(path.Join("schemas", typ+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%q: %w", typ, ErrUnknownSchema)
	}
	if err != nil {
		return nil, fmt.Errorf("read schema %q: %w", typ, err)
	}
	return bytes.Clone(b), nil
}

// SchemaTypes returns the CloudEvents types that have a schema, sorted. It
// returns no error: the list is what was embedded at build time.
func SchemaTypes() []string {
	// Glob's only error is a malformed pattern, and this one is constant.
	names, _ := fs.Glob(schemaFS, "schemas/*.json")
	types := make([]string, 0, len(names))
	for _, n := range names {
		types = append(types, strings.TrimSuffix(path.Base(n), ".json"))
	}
	slices.Sort(types)
	return types
}
