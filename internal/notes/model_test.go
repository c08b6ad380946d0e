package notes_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/notes"
)

func ptr(s string) *string { return &s }

func fields(err error) []string {
	var verr *notes.ValidationError
	if !errors.As(err, &verr) {
		return nil
	}
	out := make([]string, len(verr.Errors))
	for i, e := range verr.Errors {
		out[i] = e.Field
	}
	return out
}

func hexSHA(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func b64(b []byte) *string { return ptr(base64.StdEncoding.EncodeToString(b)) }

func TestValidateTitleAndBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		title     *string
		body      *string
		wantTitle string
		wantBody  string
		wantErr   []string // fields named by the *ValidationError, in order
	}{
		{name: "title only", title: ptr("Groceries"), wantTitle: "Groceries"},
		{name: "title required", title: nil, wantErr: []string{"title"}},
		{name: "title empty", title: ptr(""), wantErr: []string{"title"}},
		{name: "title one char", title: ptr("x"), wantTitle: "x"},
		{name: "title 200 ASCII", title: ptr(strings.Repeat("a", 200)), wantTitle: strings.Repeat("a", 200)},
		{name: "title 201 ASCII", title: ptr(strings.Repeat("a", 201)), wantErr: []string{"title"}},
		{name: "title 200 two-byte code points", title: ptr(strings.Repeat("é", 200)), wantTitle: strings.Repeat("é", 200)},
		{name: "title 201 two-byte code points", title: ptr(strings.Repeat("é", 201)), wantErr: []string{"title"}},
		{name: "title 200 emoji", title: ptr(strings.Repeat("😀", 200)), wantTitle: strings.Repeat("😀", 200)},
		{name: "title 200 NFD code points", title: ptr(strings.Repeat("e\u0301", 100)), wantTitle: strings.Repeat("e\u0301", 100)},
		{name: "title 201 NFD code points", title: ptr(strings.Repeat("e\u0301", 100) + "e"), wantErr: []string{"title"}},
		{name: "title NUL", title: ptr("a\x00b"), wantErr: []string{"title"}},
		{name: "title tab", title: ptr("a\tb"), wantErr: []string{"title"}},
		{name: "title newline", title: ptr("a\nb"), wantErr: []string{"title"}},
		{name: "title carriage return", title: ptr("a\rb"), wantErr: []string{"title"}},
		{name: "title DEL", title: ptr("a\x7fb"), wantErr: []string{"title"}},
		{name: "title NEL (C1 control)", title: ptr("a\u0085b"), wantErr: []string{"title"}},
		{name: "title U+009F", title: ptr("\u009f"), wantErr: []string{"title"}},
		{name: "title only a control char", title: ptr("\n"), wantErr: []string{"title"}},
		{name: "title zero-width space (Cf)", title: ptr("\u200b"), wantTitle: "\u200b"},
		{name: "title RLM (Cf)", title: ptr("a\u200fb"), wantTitle: "a\u200fb"},
		{name: "title line separator (Zl)", title: ptr("a\u2028b"), wantTitle: "a\u2028b"},
		{name: "title private use (Co)", title: ptr("\ue000"), wantTitle: "\ue000"},
		{name: "title emoji ZWJ sequence", title: ptr("👩\u200d💻"), wantTitle: "👩\u200d💻"},
		{name: "title not trimmed", title: ptr("  padded  "), wantTitle: "  padded  "},
		{name: "title only spaces", title: ptr("   "), wantTitle: "   "},
		{name: "title NFD not normalised", title: ptr("Cafe\u0301"), wantTitle: "Cafe\u0301"},
		{name: "title NFC not normalised", title: ptr("Caf\u00e9"), wantTitle: "Caf\u00e9"},
		{name: "title too long and control: both reported", title: ptr(strings.Repeat("a", 201) + "\n"), wantErr: []string{"title", "title"}},

		{name: "body omitted is empty", title: ptr("t"), body: nil, wantTitle: "t", wantBody: ""},
		{name: "body empty", title: ptr("t"), body: ptr(""), wantTitle: "t", wantBody: ""},
		{name: "body kept exactly", title: ptr("t"), body: ptr("  line 1\n\tline 2\r\n"), wantTitle: "t", wantBody: "  line 1\n\tline 2\r\n"},
		{name: "body 65536 ASCII", title: ptr("t"), body: ptr(strings.Repeat("b", 65536)), wantTitle: "t", wantBody: strings.Repeat("b", 65536)},
		{name: "body 65537 ASCII", title: ptr("t"), body: ptr(strings.Repeat("b", 65537)), wantErr: []string{"body"}},
		{name: "body 65536 multi-byte", title: ptr("t"), body: ptr(strings.Repeat("é", 65536)), wantTitle: "t", wantBody: strings.Repeat("é", 65536)},
		{name: "body 65537 multi-byte", title: ptr("t"), body: ptr(strings.Repeat("é", 65537)), wantErr: []string{"body"}},
		{name: "body NUL", title: ptr("t"), body: ptr("a\x00b"), wantErr: []string{"body"}},
		{name: "body other controls allowed", title: ptr("t"), body: ptr("\x01\x1f\x7f\u0085"), wantTitle: "t", wantBody: "\x01\x1f\x7f\u0085"},
		{name: "title and body errors together", title: nil, body: ptr("\x00"), wantErr: []string{"title", "body"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := notes.Validate(notes.CreateInput{Title: tt.title, Body: tt.body}, 1024)
			if tt.wantErr != nil {
				var verr *notes.ValidationError
				require.ErrorAs(t, err, &verr)
				require.Equal(t, tt.wantErr, fields(err))
				for _, e := range verr.Errors {
					require.NotEmpty(t, e.Message)
				}
				require.Equal(t, notes.CreateParams{}, p)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantTitle, p.Title)
			require.Equal(t, tt.wantBody, p.Body)
			require.Nil(t, p.Attachment)
		})
	}
}

func TestValidateAttachment(t *testing.T) {
	t.Parallel()
	const limit = 16
	data := []byte("hello, attachment")[:limit:limit] // exactly at the limit; appends copy
	att := func(filename, contentType, data *string) *notes.AttachmentInput {
		return &notes.AttachmentInput{Filename: filename, ContentType: contentType, Data: data}
	}
	ok := func(d *string) *notes.AttachmentInput { return att(ptr("a.txt"), ptr("text/plain"), d) }

	tests := []struct {
		name     string
		in       *notes.AttachmentInput
		wantData []byte
		wantErr  []string
		tooLarge bool
	}{
		{name: "valid", in: ok(b64([]byte("hi"))), wantData: []byte("hi")},
		{name: "exactly at the limit", in: ok(b64(data)), wantData: data},
		{name: "one byte over the limit", in: ok(b64(append(data, 'x'))), tooLarge: true},
		{name: "two bytes over the limit", in: ok(b64(append(data, "xy"...))), tooLarge: true},
		{name: "three bytes over the limit", in: ok(b64(append(data, "xyz"...))), tooLarge: true},
		{name: "far over the limit", in: ok(b64(make([]byte, 10*limit))), tooLarge: true},
		{name: "binary bytes", in: ok(b64([]byte{0, 0xff, 0xfe, '+', '/'})), wantData: []byte{0, 0xff, 0xfe, '+', '/'}},
		{name: "one-byte padding", in: ok(ptr("QUI=")), wantData: []byte("AB")},
		{name: "two-byte padding", in: ok(ptr("QQ==")), wantData: []byte("A")},
		{name: "content type with parameters", in: att(ptr("a.txt"), ptr("text/plain; charset=utf-8"), ptr("QQ==")), wantData: []byte("A")},
		{name: "filename 255 code points", in: att(ptr(strings.Repeat("é", 255)), ptr("text/plain"), ptr("QQ==")), wantData: []byte("A")},

		{name: "filename required", in: att(nil, ptr("text/plain"), ptr("QQ==")), wantErr: []string{"attachment.filename"}},
		{name: "filename empty", in: att(ptr(""), ptr("text/plain"), ptr("QQ==")), wantErr: []string{"attachment.filename"}},
		{name: "filename 256 code points", in: att(ptr(strings.Repeat("é", 256)), ptr("text/plain"), ptr("QQ==")), wantErr: []string{"attachment.filename"}},
		{name: "filename with slash", in: att(ptr("../etc/passwd"), ptr("text/plain"), ptr("QQ==")), wantErr: []string{"attachment.filename"}},
		{name: "filename with backslash", in: att(ptr(`a\b`), ptr("text/plain"), ptr("QQ==")), wantErr: []string{"attachment.filename"}},
		{name: "filename with control", in: att(ptr("a\nb"), ptr("text/plain"), ptr("QQ==")), wantErr: []string{"attachment.filename"}},
		{name: "content type required", in: att(ptr("a"), nil, ptr("QQ==")), wantErr: []string{"attachment.content_type"}},
		{name: "content type empty", in: att(ptr("a"), ptr(""), ptr("QQ==")), wantErr: []string{"attachment.content_type"}},
		{name: "content type not a media type", in: att(ptr("a"), ptr("plain"), ptr("QQ==")), wantErr: []string{"attachment.content_type"}},
		{name: "content type too long", in: att(ptr("a"), ptr("text/"+strings.Repeat("x", 251)), ptr("QQ==")), wantErr: []string{"attachment.content_type"}},
		{name: "data required", in: ok(nil), wantErr: []string{"attachment.data"}},
		{name: "all attachment members missing", in: att(nil, nil, nil), wantErr: []string{"attachment.filename", "attachment.content_type", "attachment.data"}},

		{name: "base64 non-strict trailing bits", in: ok(ptr("QR==")), wantErr: []string{"attachment.data"}},
		{name: "base64 non-strict trailing bits (one pad)", in: ok(ptr("QUJ=")), wantErr: []string{"attachment.data"}},
		{name: "base64 missing padding", in: ok(ptr("QQ")), wantErr: []string{"attachment.data"}},
		{name: "base64 missing one pad", in: ok(ptr("QUI")), wantErr: []string{"attachment.data"}},
		{name: "base64 URL alphabet", in: ok(ptr("-_-_")), wantErr: []string{"attachment.data"}},
		{name: "base64 URL alphabet mixed", in: ok(ptr("ab-c")), wantErr: []string{"attachment.data"}},
		{name: "base64 garbage", in: ok(ptr("!!!!")), wantErr: []string{"attachment.data"}},
		{name: "base64 inner space", in: ok(ptr("QU JD")), wantErr: []string{"attachment.data"}},
		{name: "base64 leading space", in: ok(ptr(" QUJD")), wantErr: []string{"attachment.data"}},
		{name: "base64 excess padding", in: ok(ptr("QQ===")), wantErr: []string{"attachment.data"}},
		{name: "base64 padding in the middle", in: ok(ptr("QQ==QQ==")), wantErr: []string{"attachment.data"}},
		{name: "base64 data URL", in: ok(ptr("data:text/plain;base64,QQ==")), wantErr: []string{"attachment.data"}},
		{name: "bad base64 with other attachment errors", in: att(nil, ptr("nope"), ptr("QR==")), wantErr: []string{"attachment.filename", "attachment.content_type", "attachment.data"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := notes.Validate(notes.CreateInput{Title: ptr("t"), Attachment: tt.in}, limit)
			switch {
			case tt.tooLarge:
				var tl *notes.TooLargeError
				require.ErrorAs(t, err, &tl)
				require.Equal(t, limit, tl.Limit)
				require.Greater(t, tl.Size, limit)
				require.NotEmpty(t, tl.Error())
				require.Nil(t, p.Attachment)
			case tt.wantErr != nil:
				require.Equal(t, tt.wantErr, fields(err), "err: %v", err)
				require.Nil(t, p.Attachment)
			default:
				require.NoError(t, err)
				require.NotNil(t, p.Attachment)
				require.Equal(t, *tt.in.Filename, p.Attachment.Filename)
				require.Equal(t, *tt.in.ContentType, p.Attachment.ContentType)
				require.Equal(t, tt.wantData, p.Attachment.Data)
				require.Equal(t, hexSHA(tt.wantData), p.Attachment.SHA256)
				require.Len(t, p.Attachment.SHA256, 64)
			}
		})
	}
}

// RFC 4648 §3.3: data with characters outside the alphabet (here CR, LF) is
// rejected unless the referring spec says otherwise, and the SPEC asks for
// standard base64. encoding/base64's Strict mode still ignores CR and LF.
func TestValidateAttachmentRejectsLineBreaksInBase64(t *testing.T) {
	t.Parallel()
	for _, data := range []string{"QUJD\nREVG", "QUJD\r\nREVG", "QUJDREVG\n", "\nQQ=="} {
		_, err := notes.Validate(notes.CreateInput{Title: ptr("t"),
			Attachment: &notes.AttachmentInput{Filename: ptr("a"), ContentType: ptr("text/plain"), Data: ptr(data)}}, 1024)
		require.Equal(t, []string{"attachment.data"}, fields(err), "data %q", data)
	}
}

// The 413 detail says "the decoded attachment is N bytes": N must be the
// decoded size, not an estimate from the encoded length.
func TestValidateTooLargeReportsDecodedSize(t *testing.T) {
	t.Parallel()
	for size := 2; size <= 10; size++ {
		_, err := notes.Validate(notes.CreateInput{Title: ptr("t"),
			Attachment: &notes.AttachmentInput{Filename: ptr("a"), ContentType: ptr("text/plain"), Data: b64(make([]byte, size))}}, 1)
		var tl *notes.TooLargeError
		require.ErrorAs(t, err, &tl)
		require.Equal(t, size, tl.Size, "size %d", size)
	}
}

func TestValidateReportsAllErrorsTogether(t *testing.T) {
	t.Parallel()
	_, err := notes.Validate(notes.CreateInput{
		Title: ptr(""),
		Body:  ptr("\x00"),
		Attachment: &notes.AttachmentInput{
			Filename: ptr("a/b"), ContentType: nil, Data: ptr("not base64"),
		},
	}, 1024)
	var verr *notes.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, []string{"title", "body", "attachment.filename", "attachment.content_type", "attachment.data"}, fields(err))
	msg := err.Error()
	for _, f := range fields(err) {
		require.Contains(t, msg, f)
	}
}

func TestValidateTooLargeWinsOverValidationErrors(t *testing.T) {
	t.Parallel()
	_, err := notes.Validate(notes.CreateInput{
		Title:      nil,
		Attachment: &notes.AttachmentInput{Filename: ptr("a"), ContentType: ptr("text/plain"), Data: b64(make([]byte, 100))},
	}, 10)
	var tl *notes.TooLargeError
	require.ErrorAs(t, err, &tl)
	require.Equal(t, 10, tl.Limit)
}

// checkCreateInvariants asserts what accepted parameters promise (SPEC §3).
func checkCreateInvariants(t *testing.T, in notes.CreateInput, limit int, p notes.CreateParams) {
	t.Helper()
	require.NotNil(t, in.Title)
	require.Equal(t, *in.Title, p.Title, "title stored exactly")
	n := utf8.RuneCountInString(p.Title)
	require.True(t, n >= 1 && n <= notes.MaxTitleChars, "title length %d", n)
	for _, r := range p.Title {
		require.False(t, unicode.Is(unicode.Cc, r), "title contains Cc %U", r)
	}
	if in.Body == nil {
		require.Empty(t, p.Body)
	} else {
		require.Equal(t, *in.Body, p.Body)
	}
	require.LessOrEqual(t, utf8.RuneCountInString(p.Body), notes.MaxBodyChars)
	require.NotContains(t, p.Body, "\x00")

	if in.Attachment == nil {
		require.Nil(t, p.Attachment)
		return
	}
	a := p.Attachment
	require.NotNil(t, a)
	require.Equal(t, *in.Attachment.Filename, a.Filename)
	require.NotEmpty(t, a.Filename)
	require.NotContains(t, a.Filename, "/")
	require.Equal(t, *in.Attachment.ContentType, a.ContentType)
	require.LessOrEqual(t, len(a.Data), limit)
	require.Equal(t, hexSHA(a.Data), a.SHA256)
	decoded, err := base64.StdEncoding.DecodeString(*in.Attachment.Data)
	require.NoError(t, err)
	require.Equal(t, decoded, a.Data)
	if !strings.ContainsAny(*in.Attachment.Data, "\r\n") { // see TestValidateAttachmentRejectsLineBreaksInBase64
		require.Equal(t, *in.Attachment.Data, base64.StdEncoding.EncodeToString(a.Data), "accepted data is canonical standard base64")
	}
}

func FuzzValidate(f *testing.F) {
	f.Add("t", "", "a.txt", "text/plain", "QQ==", uint8(0xff), uint8(4))
	f.Add("", "\x00", "", "", "QR==", uint8(0xff), uint8(0))
	f.Add(strings.Repeat("é", 200), strings.Repeat("b", 100), "x", "image/png", "QUJDREVG", uint8(0x0f), uint8(6))
	f.Add("a\u0085b", "body", "a/b", "nope", "-_-_", uint8(0xff), uint8(1))
	f.Add("\u200b", "", "f", "text/plain; charset=utf-8", "QUJDRA==", uint8(0xff), uint8(3))
	f.Add("title", "b", "f", "text/plain", "", uint8(0xff), uint8(0))
	f.Fuzz(func(t *testing.T, title, body, filename, contentType, data string, present, limitByte uint8) {
		opt := func(bit uint8, s string) *string {
			if present&bit == 0 {
				return nil
			}
			return &s
		}
		in := notes.CreateInput{Title: opt(1, title), Body: opt(2, body)}
		if present&4 != 0 {
			in.Attachment = &notes.AttachmentInput{
				Filename: opt(8, filename), ContentType: opt(16, contentType), Data: opt(32, data),
			}
		}
		limit := int(limitByte)
		p, err := notes.Validate(in, limit)

		var (
			verr *notes.ValidationError
			tl   *notes.TooLargeError
		)
		switch {
		case err == nil:
			// Invalid UTF-8 never gets here through the API: the JSON
			// decoder rejects it.
			if !utf8.ValidString(title) || !utf8.ValidString(body) || !utf8.ValidString(filename) {
				return
			}
			checkCreateInvariants(t, in, limit, p)
		case errors.As(err, &tl):
			require.NotNil(t, in.Attachment)
			require.NotNil(t, in.Attachment.Data)
			require.Equal(t, limit, tl.Limit)
			require.Greater(t, tl.Size, limit)
			// Never "too large" for canonical base64 within the limit.
			if d, derr := base64.StdEncoding.Strict().DecodeString(data); derr == nil && base64.StdEncoding.EncodeToString(d) == data {
				require.Greater(t, len(d), limit, "canonical %d-byte data refused as too large for limit %d", len(d), limit)
			}
		case errors.As(err, &verr):
			require.NotEmpty(t, verr.Errors)
			for _, e := range verr.Errors {
				require.Contains(t, []string{"title", "body", "attachment.filename", "attachment.content_type", "attachment.data"}, e.Field)
				require.NotEmpty(t, e.Message)
			}
			require.Equal(t, notes.CreateParams{}, p)
		default:
			t.Fatalf("unexpected error type %T: %v", err, err)
		}
	})
}

// AppendJSON gives json.Marshal's bytes, with and without an attachment,
// for text that needs escaping, and fails where marshaling fails.
func TestNoteViewAppendJSON(t *testing.T) {
	t.Parallel()
	att := &notes.AttachmentView{ID: "a1", Filename: "x \"y\".png", ContentType: "image/png", Size: 1 << 20, SHA256: "ab", Status: "pending"}
	for _, v := range []notes.NoteView{
		{ID: "n1", Title: "groceries", Body: "milk", CreatedAt: "2026-12-03T10:00:00.000000Z", Version: 1, UpdatedAt: "2026-12-03T10:00:00.000000Z"},
		{ID: "n2", Title: "<b>&\"quoted\"\\ \u2028\u2029 \t\n\x01 é 🦀", Body: "", Attachment: att, Version: 2147483647},
		{},
	} {
		want, err := json.Marshal(v)
		require.NoError(t, err)
		got, err := v.AppendJSON([]byte("prefix"))
		require.NoError(t, err)
		require.Equal(t, "prefix"+string(want), string(got))
	}
	bad := notes.NoteView{Title: "\xff"}
	_, err := json.Marshal(bad)
	require.Error(t, err)
	_, err = bad.AppendJSON(nil)
	require.Error(t, err)
}
