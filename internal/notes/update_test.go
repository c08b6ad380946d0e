package notes_test

import (
	"strings"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/notes"
)

func TestValidateUpdate(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name   string
		body   string
		want   notes.UpdateParams
		fields []string // invalid fields; nil: valid
		decode bool     // the decoder refuses it (invalid_json)
	}{
		{name: "title", body: `{"title":"new"}`, want: notes.UpdateParams{Title: str("new")}},
		{name: "body", body: `{"body":"text"}`, want: notes.UpdateParams{Body: str("text")}},
		{name: "empty body is a value", body: `{"body":""}`, want: notes.UpdateParams{Body: str("")}},
		{name: "both", body: `{"title":"t","body":"b"}`, want: notes.UpdateParams{Title: str("t"), Body: str("b")}},
		{name: "title of 200 code points", body: `{"title":"` + strings.Repeat("é", 200) + `"}`, want: notes.UpdateParams{Title: str(strings.Repeat("é", 200))}},
		{name: "title kept exactly", body: `{"title":" spaced "}`, want: notes.UpdateParams{Title: str(" spaced ")}},
		{name: "neither", body: `{}`, fields: []string{"title"}},
		{name: "null title", body: `{"title":null}`, fields: []string{"title"}},
		{name: "null body", body: `{"body":null}`, fields: []string{"body"}},
		{name: "null title with a body", body: `{"title":null,"body":"b"}`, fields: []string{"title"}},
		{name: "empty title", body: `{"title":""}`, fields: []string{"title"}},
		{name: "title too long", body: `{"title":"` + strings.Repeat("a", 201) + `"}`, fields: []string{"title"}},
		{name: "control character", body: `{"title":"a\u0085b"}`, fields: []string{"title"}},
		{name: "body too long", body: `{"body":"` + strings.Repeat("a", notes.MaxBodyChars+1) + `"}`, fields: []string{"body"}},
		{name: "NUL in body", body: `{"body":"a\u0000"}`, fields: []string{"body"}},
		{name: "every field wrong", body: `{"title":"","body":"\u0000"}`, fields: []string{"title", "body"}},
		{name: "number", body: `{"title":1}`, decode: true},
		{name: "object", body: `{"body":{}}`, decode: true},
		{name: "unknown member", body: `{"title":"t","version":2}`, decode: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in notes.UpdateInput
			err := json.Unmarshal([]byte(tc.body), &in, json.RejectUnknownMembers(true))
			if tc.decode {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			got, err := notes.ValidateUpdate(in)
			if tc.fields == nil {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			var verr *notes.ValidationError
			require.ErrorAs(t, err, &verr)
			var fields []string
			for _, f := range verr.Errors {
				fields = append(fields, f.Field)
			}
			require.Equal(t, tc.fields, fields)
		})
	}
}

// Whatever bytes an update's body holds, decoding and validation either
// refuse it or give parameters that hold exactly what was sent, each field
// within its limits, and at least one field.
func FuzzValidateUpdate(f *testing.F) {
	for _, s := range []string{`{"title":"t"}`, `{"body":""}`, `{"title":null}`, `{}`, `{"title":"a\u0085"}`,
		`{"title":"x","body":"\u0000"}`, `{"title":1}`, `[]`, `{"body":"é"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var in notes.UpdateInput
		if err := json.Unmarshal(raw, &in, json.RejectUnknownMembers(true)); err != nil {
			return
		}
		p, err := notes.ValidateUpdate(in)
		if err != nil {
			var verr *notes.ValidationError
			require.ErrorAs(t, err, &verr)
			require.NotEmpty(t, verr.Errors)
			require.Equal(t, notes.UpdateParams{}, p)
			return
		}
		require.True(t, p.Title != nil || p.Body != nil)
		if p.Title != nil {
			require.Equal(t, in.Title.Value, *p.Title)
			require.NotEmpty(t, *p.Title)
			require.LessOrEqual(t, len([]rune(*p.Title)), notes.MaxTitleChars)
		}
		if p.Body != nil {
			require.Equal(t, in.Body.Value, *p.Body)
			require.NotContains(t, *p.Body, "\x00")
		}
	})
}
