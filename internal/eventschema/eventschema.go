// Package eventschema checks a CloudEvent as Quill publishes it against the
// JSON Schema (2020-12) of its type's data, the files of api/schemas that
// the API serves at /schemas/<type>.json, and its envelope against SPEC §5.
// Tests call it on every message the relay and the attachment worker
// publish, so that a payload that drifts from its published schema fails a
// test rather than a consumer.
package eventschema

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/outbox"
)

// ErrInvalid is wrapped by every error Validate returns for an event that
// breaks its envelope or its schema.
var ErrInvalid = errors.New("event does not match its schema")

// strictPrefix names the strict variant of each schema (see strict): it
// must not share its $id with the published one, which the same compiler
// would then hold twice.
const strictPrefix = "urn:quill:schema-strict:"

// Validator holds the compiled schemas of every event type. It is safe for
// concurrent use: compiled schemas are read-only.
type Validator struct {
	published map[string]*jsonschema.Schema
	// strict is each published schema with additionalProperties false on
	// every object that declares properties. The published schemas let
	// members through for forward compatibility (decision 0051), which
	// would also let a producer emit a member the schema never describes;
	// the strict variant catches that.
	strict map[string]*jsonschema.Schema
}

// New compiles the schema of every type in api.SchemaTypes, each checked
// against the 2020-12 meta-schema. It returns an error naming the file when
// one does not parse or compile, or when its $id is not the dataschema the
// outbox writes for its type.
func New() (*Validator, error) {
	v := &Validator{published: map[string]*jsonschema.Schema{}, strict: map[string]*jsonschema.Schema{}}
	for _, typ := range api.SchemaTypes() {
		raw, err := api.Schema(typ)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("api/schemas/%s.json: %w", typ, err)
		}
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("api/schemas/%s.json: not a JSON object", typ)
		}
		id := contract.DataSchemaPrefix + typ
		if obj["$id"] != id {
			return nil, fmt.Errorf("api/schemas/%s.json: $id is %v, want %s (the dataschema its events carry)", typ, obj["$id"], id)
		}
		if v.published[typ], err = compile(id, obj); err != nil {
			return nil, fmt.Errorf("api/schemas/%s.json: %w", typ, err)
		}
		s := strict(obj).(map[string]any)
		s["$id"] = strictPrefix + typ
		if v.strict[typ], err = compile(strictPrefix+typ, s); err != nil {
			return nil, fmt.Errorf("api/schemas/%s.json (strict): %w", typ, err)
		}
	}
	return v, nil
}

func compile(id string, doc map[string]any) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	// Formats (uuid, date-time) are annotations only in 2020-12 unless
	// asserted; Quill's consumers may assert them, so the tests do.
	c.AssertFormat()
	if err := c.AddResource(id, doc); err != nil {
		return nil, fmt.Errorf("add schema: %w", err)
	}
	s, err := c.Compile(id)
	if err != nil {
		return nil, fmt.Errorf("compile schema: %w", err)
	}
	return s, nil
}

// strict returns a copy of the schema value v in which every object schema
// ("type": "object") that declares properties allows no other member. It
// leaves schemas without a type alone: an "if" that names one property
// must still match an object with others.
func strict(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v)+1)
		for k, x := range v {
			out[k] = strict(x)
		}
		if _, ok := v["properties"]; ok && v["type"] == "object" {
			out["additionalProperties"] = false
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = strict(x)
		}
		return out
	default:
		return v
	}
}

// Validate checks cloudEventJSON, one message body as the relay publishes
// it: CloudEvents 1.0 structured JSON with exactly Quill's attributes
// (SPEC §5), a dataschema naming its type's schema, and data valid against
// that schema, with no member the schema does not declare. It returns an
// error wrapping ErrInvalid that says what is wrong.
func (v *Validator) Validate(cloudEventJSON []byte) error {
	var ce outbox.CloudEvent
	if err := json.Unmarshal(cloudEventJSON, &ce, json.RejectUnknownMembers(true)); err != nil {
		return fmt.Errorf("%w: not a Quill CloudEvent: %w", ErrInvalid, err)
	}
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: event %s (%s): %s", ErrInvalid, ce.ID, ce.Type, fmt.Sprintf(format, args...))
	}
	if ce.SpecVersion != "1.0" {
		return invalid("specversion %q, want 1.0", ce.SpecVersion)
	}
	if id, err := uuid.Parse(ce.ID); err != nil || id.String() != ce.ID {
		return invalid("id is not a lower-case UUID")
	}
	if t, ok := contract.SourceTenant(ce.Source); !ok || !contract.ValidTenant(t) {
		return invalid("source %q is not /tenants/<tenant>", ce.Source)
	}
	if id, err := uuid.Parse(ce.Subject); err != nil || id.String() != ce.Subject {
		return invalid("subject %q is not a lower-case UUID (the note id)", ce.Subject)
	}
	if t, err := time.Parse(outbox.TimeFormat, ce.Time); err != nil || t.Format(outbox.TimeFormat) != ce.Time {
		return invalid("time %q is not RFC 3339 UTC with microseconds", ce.Time)
	}
	if ce.DataContentType != "application/json" {
		return invalid("datacontenttype %q, want application/json", ce.DataContentType)
	}
	published, ok := v.published[ce.Type]
	if !ok {
		return invalid("no schema for type %q", ce.Type)
	}
	if want := contract.DataSchemaPrefix + ce.Type; ce.DataSchema != want {
		return invalid("dataschema %q, want %s", ce.DataSchema, want)
	}
	if len(ce.Data) == 0 {
		return invalid("no data")
	}
	data, err := jsonschema.UnmarshalJSON(bytes.NewReader(ce.Data))
	if err != nil {
		return invalid("data: %v", err)
	}
	if err := published.Validate(data); err != nil {
		return invalid("data does not match %s: %v", ce.DataSchema, err)
	}
	if err := v.strict[ce.Type].Validate(data); err != nil {
		return invalid("data has a member %s does not declare: %v", ce.DataSchema, err)
	}
	return nil
}

// compiled is the validator Validate uses, compiled once: the schemas are
// embedded in the binary and never change while it runs.
var compiled = sync.OnceValues(New)

// Validate checks cloudEventJSON with a Validator compiled on first use
// (see Validator.Validate). It returns an error wrapping ErrInvalid for an
// invalid event, or New's error when the embedded schemas do not compile.
func Validate(cloudEventJSON []byte) error {
	v, err := compiled()
	if err != nil {
		return err
	}
	return v.Validate(cloudEventJSON)
}
