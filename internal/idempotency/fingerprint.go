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
	// Fields maps each parameter name to the hex SHA-256 of its canonical
	// JSON value.
	Fields map[string]string
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
	doc, fields, err := canonicalDoc(action, version, params, true)
	if err != nil {
		return Fingerprint{}, err
	}
	sum := sha256.Sum256(doc)
	return Fingerprint{Action: action, Version: version, Sum: sum[:], Fields: fields}, nil
}

// CanonicalJSON returns the canonical document a fingerprint is the hash of;
// exposed for tests and for explaining a fingerprint.
func CanonicalJSON(action string, version int, params Params) ([]byte, error) {
	doc, _, err := canonicalDoc(action, version, params, false)
	return doc, err
}

// member is one member of the canonical document: its name and canonical
// value.
type member struct {
	name  string
	value []byte
}

// canonicalDoc builds the canonical document of action, version and params
// and, with hashes, each parameter's hash.
func canonicalDoc(action string, version int, params Params, hashes bool) ([]byte, map[string]string, error) {
	members := make([]member, 0, len(params)+2)
	var fields map[string]string
	if hashes {
		fields = make(map[string]string, len(params))
	}
	size := 2
	for name, v := range params {
		if name == "action" || name == "v" {
			return nil, nil, fmt.Errorf("parameter name %q is reserved", name)
		}
		b, err := json.Marshal(v, canonical)
		if err != nil {
			return nil, nil, fmt.Errorf("canonical %s: %w", name, err)
		}
		if hashes {
			sum := sha256.Sum256(b)
			fields[name] = hex.EncodeToString(sum[:])
		}
		members = append(members, member{name, b})
		size += len(name) + len(b) + 4
	}
	a, err := json.Marshal(action, canonical)
	if err != nil {
		return nil, nil, fmt.Errorf("canonical document: %w", err)
	}
	members = append(members, member{"action", a}, member{"v", strconv.AppendInt(nil, int64(version), 10)})
	slices.SortFunc(members, func(x, y member) int { return strings.Compare(x.name, y.name) })
	doc := make([]byte, 0, size+len(a)+32)
	doc = append(doc, '{')
	for i, m := range members {
		if i > 0 {
			doc = append(doc, ',')
		}
		if doc, err = jsontext.AppendQuote(doc, m.name); err != nil {
			return nil, nil, fmt.Errorf("canonical document: parameter name %q: %w", m.name, err)
		}
		doc = append(doc, ':')
		doc = append(doc, m.value...)
	}
	return append(doc, '}'), fields, nil
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
