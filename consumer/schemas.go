package consumer

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/quillhq/quill/contract"
)

// ErrSchema is wrapped by every error of a SchemaValidator's function: the
// event's data breaks the JSON Schema of its type, or the event names
// another schema than its type's.
var ErrSchema = errors.New("event does not match its schema")

// SchemaValidator returns a function for Config.Validate that checks each
// event's data against the JSON Schema (2020-12) of its type — the schemas
// this version of Quill publishes, embedded in package contract, the files
// the API serves at /schemas/<type>.json. With it a message whose data breaks
// its schema becomes a dead letter whose reason names the member, before
// any transaction begins, instead of failing inside the handler on every
// delivery.
//
// An event of a type this build has no schema for (a type a newer Quill
// added) passes unchecked: whether to handle it is the handler's choice.
// The schemas allow members they do not declare, as a consumer must (a
// .v1 may gain optional members). The function is safe for concurrent use.
// SchemaValidator's own error means a schema of the build does not compile,
// which a test of this package rules out.
func SchemaValidator() (func(Event) error, error) {
	schemas := map[string]*jsonschema.Schema{}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for _, typ := range contract.SchemaTypes() {
		raw, err := contract.Schema(typ)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("the schema of %s: %w", typ, err)
		}
		if err := c.AddResource(contract.DataSchemaPrefix+typ, doc); err != nil {
			return nil, fmt.Errorf("the schema of %s: %w", typ, err)
		}
		if schemas[typ], err = c.Compile(contract.DataSchemaPrefix + typ); err != nil {
			return nil, fmt.Errorf("the schema of %s: %w", typ, err)
		}
	}
	return func(ev Event) error {
		s, ok := schemas[ev.Type]
		if !ok {
			return nil
		}
		if ev.DataSchema != "" && ev.DataSchema != contract.DataSchemaPrefix+ev.Type {
			return fmt.Errorf("%w: dataschema %q, want %q for type %s", ErrSchema, ev.DataSchema, contract.DataSchemaPrefix+ev.Type, ev.Type)
		}
		data, err := jsonschema.UnmarshalJSON(bytes.NewReader(ev.Data))
		if err != nil {
			return fmt.Errorf("%w: data is not JSON: %v", ErrSchema, err)
		}
		if err := s.Validate(data); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrSchema, ev.Type, err)
		}
		return nil
	}, nil
}
