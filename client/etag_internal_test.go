package client

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// Only a strong ETag of a decimal version without leading zeros names a
// version (the design's If-Match syntax); anything else is none.
func TestETagVersion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`"1"`, 1},
		{`"42"`, 42},
		{`"2147483647"`, MaxVersion},
		{`"2147483648"`, 0},
		{`"0"`, 0},
		{`"01"`, 0},
		{`"-1"`, 0},
		{`"+1"`, 0},
		{`W/"1"`, 0},
		{`1`, 0},
		{`""`, 0},
		{`"1", "2"`, 0},
		{`" 1"`, 0},
		{``, 0},
		{`"`, 0},
	} {
		require.Equal(t, tc.want, etagVersion(tc.in), "%q", tc.in)
	}
}

// An update's journalled parameters name what it keeps by leaving the
// member out, and a delete without If-Match is journalled as before edits.
func TestWriteParamsAsJournalled(t *testing.T) {
	t.Parallel()
	title, empty := "T", ""
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"update title", updateParams{ID: "n", IfVersion: 3, Title: &title}, `{"id":"n","if_version":3,"title":"T"}`},
		{"update body to empty", updateParams{ID: "n", IfVersion: 1, Body: &empty}, `{"id":"n","if_version":1,"body":""}`},
		{"update both", updateParams{ID: "n", IfVersion: 2, Title: &title, Body: &empty}, `{"id":"n","if_version":2,"title":"T","body":""}`},
		{"wire body", NoteUpdate{Body: &empty}, `{"body":""}`},
		{"delete", deleteParams{ID: "n"}, `{"id":"n"}`},
		{"delete if version", deleteParams{ID: "n", IfVersion: 7}, `{"id":"n","if_version":7}`},
	} {
		b, err := json.Marshal(tc.v)
		require.NoError(t, err, tc.name)
		require.JSONEq(t, tc.want, string(b), tc.name)
		require.Equal(t, tc.want, string(b), tc.name)
	}
}
