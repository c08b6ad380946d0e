package idempotency

import (
	"crypto/sha256"
	"fmt"
	"slices"

	"github.com/go-json-experiment/json"
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
func NewFingerprint(action string, version int, params Params) (Fingerprint, error) {
	fields := make(map[string]string, len(params))
	for name, v := range params {
		if name == "action" || name == "v" {
			return Fingerprint{}, fmt.Errorf("parameter name %q is reserved", name)
		}
		b, err := json.Marshal(v, canonical)
		if err != nil {
			return Fingerprint{}, fmt.Errorf("canonical %s: %w", name, err)
		}
		fields[name] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	doc, err := CanonicalJSON(action, version, params)
	if err != nil {
		return Fingerprint{}, err
	}
	sum := sha256.Sum256(doc)
	return Fingerprint{Action: action, Version: version, Sum: sum[:], Fields: fields}, nil
}

// CanonicalJSON returns the canonical document a fingerprint is the hash of;
// exposed for tests and for explaining a fingerprint.
func CanonicalJSON(action string, version int, params Params) ([]byte, error) {
	doc := make(map[string]any, len(params)+2)
	for k, v := range params {
		if k == "action" || k == "v" {
			return nil, fmt.Errorf("parameter name %q is reserved", k)
		}
		doc[k] = v
	}
	doc["action"] = action
	doc["v"] = version
	b, err := json.Marshal(doc, canonical)
	if err != nil {
		return nil, fmt.Errorf("canonical document: %w", err)
	}
	return b, nil
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
