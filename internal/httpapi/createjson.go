package httpapi

import (
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/quillhq/quill/internal/notes"
)

// decodeCreate decodes b, a create's body, into in when b is a JSON object
// of the create's members — each a string or null, the attachment an
// object of its own members or null — and reports whether it did. It
// takes only what json v2 with strict takes and decodes the same way
// (FuzzDecodeCreate holds it to that); anything else, from an unknown or
// repeated member to a member name written with escapes, it leaves to
// json v2, which decides and words the error. json v2 found a struct's
// fields by reflection for every create: 8.6 of the handler's 168 µs as
// perf counted them (issue 29). The values' bytes share one string and their
// pointers one array: two allocations for any body. text is a buffer the
// caller keeps for the decoded bytes, returned grown.
func decodeCreate(b, text []byte, in *notes.CreateInput) ([]byte, bool) {
	s := scanner{b: b}
	v := createValues{text: text[:0]}
	var seen uint8
	ok := s.object(func(name []byte) bool {
		var field int
		switch string(name) {
		case "title":
			field = fieldTitle
		case "body":
			field = fieldBody
		case "attachment":
			field = fieldAttachment
			if !s.attachment(&v) {
				return false
			}
		default:
			return false
		}
		if seen&(1<<field) != 0 {
			return false
		}
		seen |= 1 << field
		return field == fieldAttachment || s.optString(&v, field)
	})
	if !ok || !s.end() {
		return v.text, false
	}
	v.fill(in)
	return v.text, true
}

// The fields decodeCreate decodes, as indexes of createValues.
const (
	fieldTitle = iota
	fieldBody
	fieldFilename
	fieldContentType
	fieldData
	fieldAttachment // not a string: whether the attachment is an object
	fieldCount
)

// createValues are the strings decoded so far: each one's bytes in text,
// from start to end, when set.
type createValues struct {
	text       []byte
	start, end [fieldCount]int
	set        [fieldCount]bool
}

// fill sets in's members from v.
func (v *createValues) fill(in *notes.CreateInput) {
	*in = notes.CreateInput{}
	all := string(v.text)
	strs := new([fieldAttachment]string)
	ptr := func(field int) *string {
		if !v.set[field] {
			return nil
		}
		strs[field] = all[v.start[field]:v.end[field]]
		return &strs[field]
	}
	in.Title, in.Body = ptr(fieldTitle), ptr(fieldBody)
	if v.set[fieldAttachment] {
		in.Attachment = &notes.AttachmentInput{Filename: ptr(fieldFilename), ContentType: ptr(fieldContentType), Data: ptr(fieldData)}
	}
}

// attachment decodes the attachment member's value, null or an object.
func (s *scanner) attachment(v *createValues) bool {
	if s.null() {
		return true
	}
	var seen uint8
	ok := s.object(func(name []byte) bool {
		var field int
		switch string(name) {
		case "filename":
			field = fieldFilename
		case "content_type":
			field = fieldContentType
		case "data":
			field = fieldData
		default:
			return false
		}
		if seen&(1<<field) != 0 {
			return false
		}
		seen |= 1 << field
		return s.optString(v, field)
	})
	v.set[fieldAttachment] = ok
	return ok
}

// optString decodes a string or null value into v's field: null leaves it
// unset (nil), as json v2 does a pointer.
func (s *scanner) optString(v *createValues, field int) bool {
	if s.null() {
		return true
	}
	raw, escaped, ok := s.str()
	if !ok {
		return false
	}
	start := len(v.text)
	if escaped {
		var err error
		if v.text, err = jsontext.AppendUnquote(v.text, raw); err != nil {
			return false
		}
	} else {
		v.text = append(v.text, raw[1:len(raw)-1]...)
	}
	v.start[field], v.end[field], v.set[field] = start, len(v.text), true
	return true
}

// scanner reads JSON from b at i. Its methods report false for anything
// outside what decodeCreate takes, never a partial success.
type scanner struct {
	b []byte
	i int
}

// ws skips JSON's whitespace.
func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// take consumes c, after whitespace, if it is next.
func (s *scanner) take(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only whitespace is left.
func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// null consumes a null literal if it is next.
func (s *scanner) null() bool {
	s.ws()
	if len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// object reads an object, calling member with each member's name (written
// without escapes; an escaped name is not taken) positioned at its value.
func (s *scanner) object(member func(name []byte) bool) bool {
	if !s.take('{') {
		return false
	}
	if s.take('}') {
		return true
	}
	for {
		raw, escaped, ok := s.str()
		if !ok || escaped || !s.take(':') {
			return false
		}
		if !member(raw[1 : len(raw)-1]) {
			return false
		}
		if s.take(',') {
			continue
		}
		return s.take('}')
	}
}

// str reads a string literal after whitespace and returns it with its
// quotes, and whether it holds escapes (then jsontext.AppendUnquote
// validates it). One without escapes must be valid UTF-8 and hold no
// control character, as JSON requires.
func (s *scanner) str() (raw []byte, escaped, ok bool) {
	if !s.take('"') {
		return nil, false, false
	}
	start := s.i - 1
	ascii := true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			raw = s.b[start:s.i]
			if !ascii && !escaped && !utf8.Valid(raw) {
				return nil, false, false
			}
			return raw, escaped, true
		case c == '\\':
			escaped = true
			s.i += 2 // the escaped byte cannot end the string
		case c < 0x20:
			return nil, false, false
		default:
			if c >= utf8.RuneSelf {
				ascii = false
			}
			s.i++
		}
	}
	return nil, false, false
}
