package notes

import (
	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// OptionalString is a member of an update request: absent (Set false),
// null (Set and Null), or a string. An update tells "keep this field"
// (absent) from "make it empty" (""), and refuses null, which would say
// neither.
type OptionalString struct {
	Set, Null bool
	Value     string
}

// UnmarshalJSONFrom reads a string or null; any other JSON value is an
// error (invalid_json).
func (o *OptionalString) UnmarshalJSONFrom(d *jsontext.Decoder) error {
	o.Set = true
	if d.PeekKind() == 'n' {
		o.Null = true
		_, err := d.ReadToken()
		return err
	}
	return json.UnmarshalDecode(d, &o.Value)
}

// UpdateInput is the body of an update request (PATCH /v1/notes/{id}) as
// sent.
type UpdateInput struct {
	Title OptionalString `json:"title"`
	Body  OptionalString `json:"body"`
}

// UpdateParams are an update request's validated parameters: the fields
// it sets, nil for a field it keeps.
type UpdateParams struct {
	Title *string
	Body  *string
}

// ValidateUpdate checks in against SPEC §3 (each field as a create's) and
// returns its parameters. It returns a *ValidationError naming every
// invalid field, and one when in sets no field.
func ValidateUpdate(in UpdateInput) (UpdateParams, error) {
	var p UpdateParams
	verr := &ValidationError{}
	switch t := in.Title; {
	case t.Null:
		verr.Add("title", "must be a string; omit it to keep the title")
	case t.Set:
		title := checkTitle(verr, &t.Value)
		p.Title = &title
	}
	switch b := in.Body; {
	case b.Null:
		verr.Add("body", "must be a string; omit it to keep the body, send \"\" to empty it")
	case b.Set:
		checkBody(verr, b.Value)
		body := b.Value
		p.Body = &body
	}
	if !in.Title.Set && !in.Body.Set {
		verr.Add("title", "an update sets title, body or both; this one sets neither")
	}
	if len(verr.Errors) > 0 {
		return UpdateParams{}, verr
	}
	return p, nil
}
