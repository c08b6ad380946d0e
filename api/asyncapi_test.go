package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
)

// The parts of api/asyncapi.yaml the tests hold to the code. The document's
// validity against the AsyncAPI specification is scripts/validate-asyncapi.sh's
// (the AsyncAPI project's own parser, in make lint).
type asyncDoc struct {
	AsyncAPI           string `yaml:"asyncapi"`
	DefaultContentType string `yaml:"defaultContentType"`
	Servers            map[string]struct {
		Protocol string `yaml:"protocol"`
		Stream   struct {
			Name       string   `yaml:"name"`
			Subjects   []string `yaml:"subjects"`
			Storage    string   `yaml:"storage"`
			Duplicates string   `yaml:"duplicates"`
			MaxAge     string   `yaml:"maxAge"`
		} `yaml:"x-jetstream-stream"`
	} `yaml:"servers"`
	Channels map[string]struct {
		Address    string         `yaml:"address"`
		Parameters map[string]ref `yaml:"parameters"`
		Messages   map[string]ref `yaml:"messages"`
	} `yaml:"channels"`
	Operations map[string]struct {
		Action   string `yaml:"action"`
		Channel  ref    `yaml:"channel"`
		Messages []ref  `yaml:"messages"`
	} `yaml:"operations"`
	Components struct {
		Parameters map[string]struct {
			Default  string `yaml:"default"`
			XPattern string `yaml:"x-pattern"`
		} `yaml:"parameters"`
		Messages map[string]struct {
			Name        string `yaml:"name"`
			ContentType string `yaml:"contentType"`
			Headers     ref    `yaml:"headers"`
			Payload     struct {
				AllOf []struct {
					Ref        string `yaml:"$ref"`
					Properties struct {
						Type struct {
							Const string `yaml:"const"`
						} `yaml:"type"`
						DataSchema struct {
							Const string `yaml:"const"`
						} `yaml:"dataschema"`
						Data ref `yaml:"data"`
					} `yaml:"properties"`
				} `yaml:"allOf"`
			} `yaml:"payload"`
			Examples []struct {
				Name    string         `yaml:"name"`
				Headers map[string]any `yaml:"headers"`
				Payload map[string]any `yaml:"payload"`
			} `yaml:"examples"`
		} `yaml:"messages"`
		Schemas struct {
			Headers struct {
				Properties map[string]any `yaml:"properties"`
			} `yaml:"Headers"`
			CloudEvent struct {
				Required   []string `yaml:"required"`
				Properties struct {
					Source struct {
						Pattern string `yaml:"pattern"`
					} `yaml:"source"`
				} `yaml:"properties"`
			} `yaml:"CloudEvent"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

type ref struct {
	Ref string `yaml:"$ref"`
}

func asyncModel(t *testing.T) asyncDoc {
	t.Helper()
	var d asyncDoc
	require.NoError(t, yaml.Unmarshal(api.AsyncAPI(), &d))
	require.Equal(t, "3.0.0", d.AsyncAPI)
	return d
}

// eventTypes returns every event type the code emits (contract's Event
// constants, which contract's own test holds equal to EventTypes), so that
// a type added there without a channel here fails the test.
func eventTypes(t *testing.T) []string {
	t.Helper()
	types := contract.EventTypes()
	require.Contains(t, types, contract.EventNoteCreated)
	return types
}

// Every event type the code emits has exactly one channel, whose address
// is the subject package stream builds for it and whose one message is the
// event's CloudEvents type, with its data schema by reference; one receive
// operation per channel; nothing else.
func TestAsyncAPIChannelsAreTheSubjectsAndTypesTheCodeEmits(t *testing.T) {
	t.Parallel()
	d := asyncModel(t)
	types := eventTypes(t)
	require.Len(t, d.Channels, len(types), "one channel per event type, no other")
	require.Len(t, d.Operations, len(types), "one operation per channel")

	var names []string
	for _, m := range d.Components.Messages {
		names = append(names, m.Name)
	}
	require.ElementsMatch(t, api.SchemaTypes(), names, "a message for every type with a schema, and no other")

	byAddress := map[string]string{}
	for name, ch := range d.Channels {
		byAddress[ch.Address] = name
	}
	for _, typ := range types {
		ceType := contract.CloudEventType(typ)
		address := contract.Subject("{prefix}", "{tenant}", typ)
		chName, ok := byAddress[address]
		require.True(t, ok, "a channel at %s for %s", address, ceType)
		ch := d.Channels[chName]
		require.Equal(t, []string{"prefix", "tenant"}, sortedKeys(ch.Parameters), chName)
		require.Equal(t, "#/components/parameters/prefix", ch.Parameters["prefix"].Ref)
		require.Equal(t, "#/components/parameters/tenant", ch.Parameters["tenant"].Ref)

		require.Len(t, ch.Messages, 1, chName)
		var msgKey string
		for k, r := range ch.Messages {
			msgKey = k
			name, ok := strings.CutPrefix(r.Ref, "#/components/messages/")
			require.True(t, ok, "%s: message %s is a component", chName, k)
			m, ok := d.Components.Messages[name]
			require.True(t, ok, "%s: %s resolves", chName, r.Ref)
			require.Equal(t, ceType, m.Name, "%s: the message is named by its CloudEvents type", chName)
			require.Equal(t, "application/cloudevents+json", m.ContentType, chName)
			require.Equal(t, "#/components/schemas/Headers", m.Headers.Ref, chName)
			require.Len(t, m.Payload.AllOf, 2, chName)
			require.Equal(t, "#/components/schemas/CloudEvent", m.Payload.AllOf[0].Ref, chName)
			require.Equal(t, ceType, m.Payload.AllOf[1].Properties.Type.Const, "%s: the payload's type", chName)
			require.Equal(t, contract.DataSchema(typ), m.Payload.AllOf[1].Properties.DataSchema.Const, "%s: the payload's dataschema", chName)
			schema := "schemas/" + ceType + ".json"
			require.Equal(t, schema, m.Payload.AllOf[1].Properties.Data.Ref, "%s: data by reference to its schema", chName)
			require.FileExists(t, schema)
		}

		receives := 0
		for opName, op := range d.Operations {
			if op.Channel.Ref != "#/channels/"+chName {
				continue
			}
			receives++
			require.Equal(t, "receive", op.Action, opName)
			require.Equal(t, []ref{{Ref: "#/channels/" + chName + "/messages/" + msgKey}}, op.Messages, opName)
		}
		require.Equal(t, 1, receives, "one receive operation on %s", chName)
	}
}

// The server and stream the document describes are package stream's
// defaults: the name, the subjects <prefix>.>, file storage, the duplicate
// window and MaxAge, and the subject prefix.
func TestAsyncAPIStreamIsTheOneTheRelayProvisions(t *testing.T) {
	t.Parallel()
	d := asyncModel(t)
	require.Equal(t, "application/cloudevents+json", d.DefaultContentType)
	require.Len(t, d.Servers, 1)
	want := stream.Config{}.WithDefaults()
	sc := want.StreamConfig()
	for name, srv := range d.Servers {
		require.Equal(t, "nats", srv.Protocol, name)
		st := srv.Stream
		require.Equal(t, sc.Name, st.Name)
		require.Equal(t, []string{contract.AllSubjects("{prefix}")}, st.Subjects)
		require.True(t, strings.EqualFold(sc.Storage.String(), st.Storage), "storage %s, want %s", st.Storage, sc.Storage)
		dup, err := time.ParseDuration(st.Duplicates)
		require.NoError(t, err)
		require.Equal(t, sc.Duplicates, dup)
		age, err := time.ParseDuration(st.MaxAge)
		require.NoError(t, err)
		require.Equal(t, sc.MaxAge, age)
	}
	require.Equal(t, want.SubjectPrefix, d.Components.Parameters["prefix"].Default)
}

// The tenant parameter's pattern accepts exactly the tenant names the API
// accepts, and the CloudEvents source carries the same pattern.
func TestAsyncAPITenantPatternIsTheAPIs(t *testing.T) {
	t.Parallel()
	d := asyncModel(t)
	pattern := d.Components.Parameters["tenant"].XPattern
	require.NotEmpty(t, pattern)
	re := regexp.MustCompile(pattern)
	names := []string{"acme", "a", "0", "a-b", "0-", "tenant-42", strings.Repeat("a", 63), strings.Repeat("a", 64),
		"", "-a", "A", "Acme", "a.b", "a*", "a>", "a b", "a_b", "ünï", "a\n"}
	for _, n := range names {
		require.Equal(t, contract.ValidTenant(n), re.MatchString(n), "tenant %q", n)
	}
	require.Equal(t, "^/tenants/"+strings.TrimPrefix(pattern, "^"), d.Components.Schemas.CloudEvent.Properties.Source.Pattern)
}

// The attributes the document requires are those outbox.Envelope writes,
// and its headers are those the relay sets.
func TestAsyncAPIAttributesAreTheEnvelopes(t *testing.T) {
	t.Parallel()
	d := asyncModel(t)
	var ce map[string]json.RawMessage
	env, err := outbox.Envelope(outbox.Event{Tenant: "acme", Type: contract.EventNoteDeleted, Time: time.Now(), Data: map[string]any{}})
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(env, &ce))
	require.ElementsMatch(t, sortedKeys(ce), d.Components.Schemas.CloudEvent.Required,
		"every attribute the envelope writes is required, and nothing else")
	require.ElementsMatch(t, []string{"Nats-Msg-Id", "Content-Type", "traceparent", "tracestate"}, sortedKeys(d.Components.Schemas.Headers.Properties))
}

// Every message has examples, and each is valid against the message's
// payload and headers schemas, the data schemas of api/schemas resolved.
// (The AsyncAPI parser's 3.0 rules do not check examples.)
func TestAsyncAPIExamplesMatchTheirSchemas(t *testing.T) {
	t.Parallel()
	d := asyncModel(t)
	c, docURL := asyncCompiler(t)
	headers, err := c.Compile(docURL + "#/components/schemas/Headers")
	require.NoError(t, err)
	for name, m := range d.Components.Messages {
		payload, err := c.Compile(docURL + "#/components/messages/" + name + "/payload")
		require.NoError(t, err, name)
		require.NotEmpty(t, m.Examples, "%s has examples", name)
		for _, ex := range m.Examples {
			where := fmt.Sprintf("%s example %q", name, ex.Name)
			require.NoError(t, payload.Validate(jsonValue(t, ex.Payload)), where)
			require.NoError(t, headers.Validate(jsonValue(t, ex.Headers)), where)
			require.Equal(t, m.Name, ex.Payload["type"], where)
			require.Equal(t, ex.Payload["id"], ex.Headers["Nats-Msg-Id"], "%s: Nats-Msg-Id is the event id", where)
		}
	}
}

// A payload that breaks the data schema, or the envelope's, is refused by
// the compiled message schemas: the examples test can fail.
func TestAsyncAPIMessageSchemasRefuseBadEvents(t *testing.T) {
	t.Parallel()
	c, docURL := asyncCompiler(t)
	payload, err := c.Compile(docURL + "#/components/messages/attachmentProcessed/payload")
	require.NoError(t, err)
	good := map[string]any{"specversion": "1.0", "id": "2b9a4c6d-1e3f-8057-a8b9-c0d1e2f3a4b5", "source": "/tenants/acme",
		"type": "quill.attachment.processed.v1", "subject": "01a229cf-df18-8236-a349-3735bd4a95ce", "time": "2026-11-30T00:16:58.912004Z",
		"datacontenttype": "application/json", "dataschema": "urn:quill:schema:quill.attachment.processed.v1",
		"data": map[string]any{"note_id": "01a229cf-df18-8236-a349-3735bd4a95ce", "attachment_id": "5c1d3e0a-8f7e-8b2c-9d4e-2f6a7b8c9d0e",
			"state": "processed", "detected_type": "image/png"}}
	require.NoError(t, payload.Validate(jsonValue(t, good)))
	cases := map[string]func(e map[string]any){
		"another type":       func(e map[string]any) { e["type"] = "quill.note.created.v1" },
		"a bad source":       func(e map[string]any) { e["source"] = "/tenants/Acme" },
		"no id":              func(e map[string]any) { delete(e, "id") },
		"another dataschema": func(e map[string]any) { e["dataschema"] = "urn:quill:schema:quill.note.created.v1" },
		"specversion 0.3":    func(e map[string]any) { e["specversion"] = "0.3" },
		"data off its enum":  func(e map[string]any) { e["data"].(map[string]any)["state"] = "bogus" },
		"data missing a key": func(e map[string]any) { delete(e["data"].(map[string]any), "note_id") },
	}
	for name, mutate := range cases {
		e := jsonValue(t, good).(map[string]any)
		mutate(e)
		require.Error(t, payload.Validate(e), name)
	}
}

// asyncCompiler returns a JSON Schema compiler holding api/asyncapi.yaml
// as a resource at its file URL, so that its relative references to
// schemas/<type>.json load the files beside it. AsyncAPI's schema format
// is a superset of draft 7; the data schemas declare 2020-12 themselves.
func asyncCompiler(t *testing.T) (*jsonschema.Compiler, string) {
	t.Helper()
	abs, err := filepath.Abs("asyncapi.yaml")
	require.NoError(t, err)
	docURL := "file://" + filepath.ToSlash(abs)
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(api.AsyncAPI(), &doc))
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat()
	c.UseLoader(jsonschema.SchemeURLLoader{"file": jsonschema.FileLoader{}})
	require.NoError(t, c.AddResource(docURL, jsonValue(t, doc)))
	return c, docURL
}

// jsonValue returns v as encoding/json would decode it (what the schema
// validator expects): YAML's ints and maps turned into JSON's.
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	require.NoError(t, err)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
