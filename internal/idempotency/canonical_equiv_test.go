package idempotency_test

import (
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/idempotency"
)

// referenceCanonicalJSON is the canonical document as it was first
// defined: the whole document marshaled deterministically. NewFingerprint
// builds it in one pass from each parameter's own bytes; the two must
// never differ, or stored fingerprints would stop matching their retries.
func referenceCanonicalJSON(action string, version int, params idempotency.Params) ([]byte, error) {
	doc := map[string]any{"action": action, "v": version}
	for k, v := range params {
		doc[k] = v
	}
	return json.Marshal(doc, json.Deterministic(true))
}

func referenceFields(params idempotency.Params) map[string]string {
	out := map[string]string{}
	for k, v := range params {
		b, err := json.Marshal(v, json.Deterministic(true))
		if err != nil {
			panic(err)
		}
		out[k] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	return out
}

func TestCanonicalJSONMatchesTheWholeDocumentMarshaled(t *testing.T) {
	t.Parallel()
	for _, p := range []idempotency.Params{
		nil,
		{"title": "Groceries", "body": "milk", "attachment": nil},
		{"title": "\u2028<script>&\"\\\x01", "body": "é e\u0301 🎉", "attachment": map[string]any{"filename": "a.png", "size": 3, "z": []any{1.5, true, nil}}},
		{"A": 1, "a": 2, "_": 3, "~": 4, "aa": 5, "é": 6, "\u00a0": 7},
		{"actio": "x", "vv": "y", "u": "z"}, // around the reserved names in the order
	} {
		want, err := referenceCanonicalJSON("create-note", 7, p)
		require.NoError(t, err)
		got, err := idempotency.CanonicalJSON("create-note", 7, p)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
		fp, err := idempotency.NewFingerprint("create-note", 7, p)
		require.NoError(t, err)
		sum := sha256.Sum256(want)
		require.Equal(t, sum[:], fp.Sum)
		require.Equal(t, referenceFields(p), fp.Fields())
	}
}

func FuzzCanonicalJSONMatchesTheWholeDocumentMarshaled(f *testing.F) {
	f.Add("create-note", 1, "title", "Groceries", "body", "milk", int64(3))
	f.Add("x\u2028", 9, "\x7f", "<&>", "é", "\xff", int64(-1))
	f.Fuzz(func(t *testing.T, action string, version int, k1, v1, k2, v2 string, n int64) {
		p := idempotency.Params{k1: v1, k2: map[string]any{v1: n, "list": []any{v2, k1}}}
		want, werr := referenceCanonicalJSON(action, version, p)
		got, gerr := idempotency.CanonicalJSON(action, version, p)
		if k1 == "action" || k1 == "v" || k2 == "action" || k2 == "v" {
			if gerr == nil {
				t.Fatalf("reserved name %q or %q accepted", k1, k2)
			}
			return
		}
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("reference error %v, one-pass error %v", werr, gerr)
		}
		if werr == nil && string(want) != string(got) {
			t.Fatalf("documents differ:\nreference %s\none-pass  %s", want, got)
		}
	})
}
