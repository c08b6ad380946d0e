package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Params are an action's validated, defaulted parameters, by name. Values
// must be JSON-marshalable; nested objects are fine (maps or structs).
type Params map[string]any

// Fingerprint identifies one request's intent: the SHA-256 of a canonical
// JSON document of the action, its version and its parameters, plus a hash per
// parameter so that a mismatch can name the parameters that differ.
type Fingerprint struct {
	Action string
	// Version is the action's parameter-semantics version; it changes when
	// the meaning of a parameter or default changes, never silently.
	Version int
	Sum     []byte
	// fieldsJSON is each parameter's hash (Fields) as the record's
	// field_hashes column holds it; empty for a Fingerprint made by hand.
	// Only a key reused with other parameters reads the hashes by name,
	// so they are kept as the column's JSON alone: a map per request was
	// three allocations (93 → 90 per create) and about 0.7 of the
	// fingerprint's 5.4 µs as perf counted them (issue 29).
	fieldsJSON string
}

// Fields maps each parameter name to the hex SHA-256 of its canonical JSON
// value; nil for a Fingerprint made by hand.
func (fp Fingerprint) Fields() map[string]string { return parseFields(fp.fieldsJSON) }

// parseFields is the map of a field_hashes document, nil for none.
func parseFields(doc string) map[string]string {
	if doc == "" {
		return nil
	}
	var fields map[string]string
	if err := json.Unmarshal([]byte(doc), &fields); err != nil {
		return nil // never: canonicalDoc wrote it
	}
	return fields
}

// canonical marshals deterministically: object members sorted by name, no
// insignificant whitespace, strings exactly as given (no normalisation).
var canonical = json.JoinOptions(json.Deterministic(true))

// NewFingerprint computes the fingerprint of action at version with params.
// It returns an error only when a parameter cannot be marshaled.
//
// Each parameter is marshaled once: its canonical bytes are hashed for
// Fields and spliced into the canonical document, which is byte for byte
// what marshaling the whole document deterministically gives (members
// sorted by name, as json's Deterministic sorts them) — the pinned digests
// of fingerprint_golden_test.go hold it to that.
func NewFingerprint(action string, version int, params Params) (Fingerprint, error) {
	// The document is only hashed and the hashes' JSON is copied into a
	// string: both are built in buffers on the stack.
	var docBuf [512]byte
	var fieldsBuf [512]byte
	fieldsDoc := fieldsBuf[:0]
	doc, err := canonicalDoc(docBuf[:0], action, version, params, &fieldsDoc)
	if err != nil {
		return Fingerprint{}, err
	}
	sum := sha256.Sum256(doc)
	return Fingerprint{Action: action, Version: version, Sum: sum[:], fieldsJSON: string(fieldsDoc)}, nil
}

// CanonicalJSON returns the canonical document a fingerprint is the hash of;
// exposed for tests and for explaining a fingerprint.
func CanonicalJSON(action string, version int, params Params) ([]byte, error) {
	doc, err := canonicalDoc(nil, action, version, params, nil)
	return doc, err
}

// member is one member of the canonical document: its name and where its
// canonical value is in the values' buffer.
type member struct {
	name       string
	start, end int
}

// appendCanonical appends v's canonical JSON. Strings, the parameters of
// almost every action, are quoted directly — what marshaling gives them —
// and nil is null; anything else is marshaled.
func appendCanonical(dst []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case string:
		return jsontext.AppendQuote(dst, x)
	case nil:
		return append(dst, "null"...), nil
	}
	b, err := json.Marshal(v, canonical)
	if err != nil {
		return nil, err
	}
	return append(dst, b...), nil
}

// canonicalDoc builds the canonical document of action, version and params
// and, when fieldsDoc is not nil, into *fieldsDoc the JSON object of each
// parameter's hash, members sorted, as the record's field_hashes column
// holds it. Every value goes into one buffer (issue 29).
func canonicalDoc(dst []byte, action string, version int, params Params, fieldsDoc *[]byte) ([]byte, error) {
	var stack [8]member
	members := stack[:0]
	var valsBuf [512]byte
	vals := valsBuf[:0]
	for name, v := range params {
		if name == "action" || name == "v" {
			return nil, fmt.Errorf("parameter name %q is reserved", name)
		}
		start := len(vals)
		var err error
		if vals, err = appendCanonical(vals, v); err != nil {
			return nil, fmt.Errorf("canonical %s: %w", name, err)
		}
		members = append(members, member{name, start, len(vals)})
	}
	if fieldsDoc != nil {
		if len(members) > 0 {
			slices.SortFunc(members, func(x, y member) int { return strings.Compare(x.name, y.name) })
			var digestsBuf [8 * 2 * sha256.Size]byte
			digests := digestsBuf[:0]
			for _, m := range members {
				sum := sha256.Sum256(vals[m.start:m.end])
				digests = hex.AppendEncode(digests, sum[:])
			}
			doc := append((*fieldsDoc)[:0], '{')
			for i, m := range members {
				h := digests[i*hex.EncodedLen(sha256.Size) : (i+1)*hex.EncodedLen(sha256.Size)]
				if i > 0 {
					doc = append(doc, ',')
				}
				var err error
				if doc, err = jsontext.AppendQuote(doc, m.name); err != nil {
					return nil, fmt.Errorf("canonical document: parameter name %q: %w", m.name, err)
				}
				doc = append(doc, ':', '"')
				doc = append(doc, h...)
				doc = append(doc, '"')
			}
			*fieldsDoc = append(doc, '}')
		} else {
			*fieldsDoc = append((*fieldsDoc)[:0], "{}"...)
		}
	}
	start := len(vals)
	var err error
	if vals, err = jsontext.AppendQuote(vals, action); err != nil {
		return nil, fmt.Errorf("canonical document: %w", err)
	}
	members = append(members, member{"action", start, len(vals)})
	start = len(vals)
	vals = strconv.AppendInt(vals, int64(version), 10)
	members = append(members, member{"v", start, len(vals)})
	slices.SortFunc(members, func(x, y member) int { return strings.Compare(x.name, y.name) })
	size := 2
	for _, m := range members {
		size += len(m.name) + 4 + m.end - m.start
	}
	doc := slices.Grow(dst, size+8)
	doc = append(doc, '{')
	for i, m := range members {
		if i > 0 {
			doc = append(doc, ',')
		}
		if doc, err = jsontext.AppendQuote(doc, m.name); err != nil {
			return nil, fmt.Errorf("canonical document: parameter name %q: %w", m.name, err)
		}
		doc = append(doc, ':')
		doc = append(doc, vals[m.start:m.end]...)
	}
	return append(doc, '}'), nil
}

// DiffFields names the parameters whose hashes differ between a and b,
// including parameters present in only one of them, sorted.
func DiffFields(a, b map[string]string) []string {
	var out []string
	for k, va := range a {
		if vb, ok := b[k]; !ok || va != vb {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
