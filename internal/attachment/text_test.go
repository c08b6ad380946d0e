package attachment_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
)

func TestProcessText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		text     string
		declared string
		wantType string // default attachment.TypeText
		lines    int
		words    int
	}{
		{name: "empty", text: "", lines: 0, words: 0},
		{name: "a", text: "a", lines: 1, words: 1},
		{name: "a_newline", text: "a\n", lines: 1, words: 1},
		{name: "a_newline_b", text: "a\nb", lines: 2, words: 2},
		{name: "two_newlines", text: "\n\n", lines: 2, words: 0},
		{name: "two_words_padded", text: "  two words  ", lines: 1, words: 2},
		{name: "crlf", text: "one two\r\nthree\r\n", lines: 2, words: 3},
		{name: "crlf_last_line_open", text: "one\r\ntwo", lines: 2, words: 2},
		{name: "lone_cr_is_space_not_newline", text: "a\rb", lines: 1, words: 2},
		{name: "tabs_and_vertical_space", text: "\tx\ty\v\fz\t", lines: 1, words: 3},
		{name: "only_spaces", text: "   \t  ", lines: 1, words: 0},
		{name: "unicode_spaces", text: "a\u00a0b\u3000c\u2003d\u2028e\u0085f", lines: 1, words: 6},
		{name: "multibyte_words", text: "café naïve 日本語 🙂\n", lines: 1, words: 4},
		{name: "control_characters", text: "a\x01b\x1bc\n", lines: 1, words: 1},
		{name: "utf8_bom", text: "\ufeffhello\n", lines: 1, words: 1},
		{name: "html", text: "<!DOCTYPE html><p>hi there</p>\n", wantType: "text/html; charset=utf-8", lines: 1, words: 3},
		{name: "xml", text: "<?xml version=\"1.0\"?><a/>", wantType: "text/xml; charset=utf-8", lines: 1, words: 2},
		{name: "ascii_with_pdf_signature", text: "%PDF-1.4\nnot really\n", lines: 2, words: 3},
		{name: "gif_signature_but_text", text: "GIF89a is a format\n", lines: 1, words: 4},
		{name: "declared_png", text: "plain words\n", declared: "image/png", lines: 1, words: 2},
		{name: "exactly_500_ascii", text: strings.Repeat("a", 500), lines: 1, words: 1},
		{name: "preview_501_ascii", text: strings.Repeat("b", 501), lines: 1, words: 1},
		{name: "preview_two_byte", text: strings.Repeat("é", 600), lines: 1, words: 1},
		{name: "preview_four_byte", text: strings.Repeat("🙂", 501), lines: 1, words: 1},
		{name: "preview_cut_after_three_byte", text: strings.Repeat("a", 499) + "日本語", lines: 1, words: 1},
		{name: "preview_keeps_crlf", text: strings.Repeat("ab\r\n", 200), lines: 200, words: 200},
	}
	var g golden
	t.Run("cases", func(t *testing.T) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				declared := tc.declared
				if declared == "" {
					declared = "text/plain"
				}
				wantType := tc.wantType
				if wantType == "" {
					wantType = attachment.TypeText
				}
				res, err := attachment.Process(inputOf([]byte(tc.text), declared), attachment.Limits{})
				require.NoError(t, err)
				require.Equal(t, wantType, res.DetectedType)
				require.Nil(t, res.Thumbnail)
				require.NotNil(t, res.Text)
				require.Equal(t, tc.lines, res.Text.Lines, "lines")
				require.Equal(t, tc.words, res.Text.Words, "words")
				require.Equal(t, len(strings.Fields(tc.text)), res.Text.Words, "words agree with strings.Fields")

				runes := []rune(tc.text)
				want := string(runes[:min(len(runes), attachment.PreviewMaxChars)])
				require.Equal(t, want, res.Text.Preview, "preview")
				require.True(t, utf8.ValidString(res.Text.Preview))
				require.True(t, strings.HasPrefix(tc.text, res.Text.Preview))
				g.add(t, tc.name, res)
			})
		}
	})
	g.check(t, "text", len(tests))
}

// TestDetect covers the detection rules of the package documentation for
// data that is neither a processable image nor text.
func TestDetect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		data     []byte
		declared string
		wantType string
	}{
		{name: "invalid_utf8", data: []byte("caf\xe9 latin-1\n"), declared: "text/plain", wantType: attachment.TypeOctetStream},
		{name: "invalid_utf8_after_512_bytes", data: []byte(strings.Repeat("a", 600) + "\xff"), declared: "text/plain", wantType: attachment.TypeOctetStream},
		{name: "truncated_utf8_sequence", data: []byte("ab\xe6\x97"), declared: "text/plain", wantType: attachment.TypeOctetStream},
		{name: "nul_byte", data: []byte("a\x00b"), declared: "text/plain", wantType: attachment.TypeOctetStream},
		{name: "nul_after_512_bytes", data: []byte(strings.Repeat("a", 600) + "\x00"), declared: "text/plain", wantType: attachment.TypeOctetStream},
		{name: "utf16_bom", data: []byte("\xff\xfeh\x00i\x00"), declared: "text/plain", wantType: attachment.TypeOctetStream},
		{name: "binary_pdf", data: []byte("%PDF-1.7\n%\xe2\xe3\xcf\xd3\n"), declared: "application/pdf", wantType: "application/pdf"},
		{name: "zip", data: []byte("PK\x03\x04\x14\x00\x00\x00"), declared: "application/zip", wantType: "application/zip"},
		{name: "webp_is_metadata_only", data: []byte("RIFF\x24\x00\x00\x00WEBPVP8 "), declared: "image/webp", wantType: "image/webp"},
		{name: "bmp_is_metadata_only", data: []byte("BM\x00\x00\x00\x00\x00\x00"), declared: "image/bmp", wantType: "image/bmp"},
		{name: "random_binary", data: noise(8, 8).Pix, declared: "image/png", wantType: attachment.TypeOctetStream},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := attachment.Process(inputOf(tc.data, tc.declared), attachment.Limits{})
			require.NoError(t, err)
			require.Equal(t, attachment.Result{DetectedType: tc.wantType}, res)
		})
	}
}

func TestResultJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		res  attachment.Result
		want string
	}{
		{
			name: "metadata_only",
			res:  attachment.Result{DetectedType: "application/pdf"},
			want: `{"detected_type":"application/pdf","thumbnail":null,"text":null}`,
		},
		{
			name: "thumbnail_without_its_bytes",
			res:  attachment.Result{DetectedType: "image/png", Thumbnail: &attachment.Thumbnail{Width: 256, Height: 128, PNG: []byte("\x89PNG...")}},
			want: `{"detected_type":"image/png","thumbnail":{"width":256,"height":128},"text":null}`,
		},
		{
			name: "text",
			res:  attachment.Result{DetectedType: attachment.TypeText, Text: &attachment.TextStats{Lines: 2, Words: 3, Preview: "a <b>\n\"c\"\r\n"}},
			want: `{"detected_type":"text/plain; charset=utf-8","thumbnail":null,"text":{"lines":2,"words":3,"preview":"a <b>\n\"c\"\r\n"}}`,
		},
		{
			name: "empty_text",
			res:  attachment.Result{DetectedType: attachment.TypeText, Text: &attachment.TextStats{}},
			want: `{"detected_type":"text/plain; charset=utf-8","thumbnail":null,"text":{"lines":0,"words":0,"preview":""}}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.res.JSON()
			require.NoError(t, err)
			require.Equal(t, tc.want, string(got))
			again, err := tc.res.JSON()
			require.NoError(t, err)
			require.Equal(t, got, again, "deterministic")
		})
	}
	t.Run("invalid_preview", func(t *testing.T) {
		t.Parallel()
		_, err := attachment.Result{DetectedType: attachment.TypeText, Text: &attachment.TextStats{Preview: "\xff"}}.JSON()
		require.Error(t, err)
	})
}

func TestUppercaseHashIsAccepted(t *testing.T) {
	t.Parallel()
	in := inputOf([]byte("x"), "text/plain")
	in.SHA256 = strings.ToUpper(in.SHA256)
	_, err := attachment.Process(in, attachment.Limits{})
	require.NoError(t, err)
}
