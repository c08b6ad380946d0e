package idempotency

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The field hashes' JSON that NewFingerprint builds with the hashes is what
// fieldsJSON makes of its Fields map, so a record written from either has
// the same field_hashes.
func TestFingerprintFieldsJSON(t *testing.T) {
	t.Parallel()
	for _, p := range []Params{
		{},
		{"title": "a"},
		{"title": "groceries", "body": "milk", "attachment": nil},
		{"z": 1, "a": map[string]any{"y": true, "x": []any{"é", nil}}, "é": "<>&"},
	} {
		fp, err := NewFingerprint("create-note", 1, p)
		require.NoError(t, err)
		require.Len(t, fp.Fields(), len(p))
		require.Equal(t, fieldsJSON(fp.Fields()), fp.fieldsJSON, "%v", p)
	}
}
