package attachment_test

import (
	"bytes"
	"errors"
	"image/png"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/quillhq/quill/internal/attachment"
)

// FuzzProcess feeds arbitrary bytes, correctly declared, to Process. It must
// never panic; it may fail only as a corrupt image or an image too large; a
// thumbnail is a PNG of 1 to 256 pixels a side; text statistics agree with
// simple reference implementations; the result always renders as JSON.
//
// The pixel limit is 1 megapixel rather than the default, so that inputs
// whose header claims a big image cost milliseconds, not seconds; the limit
// itself is tested elsewhere.
func FuzzProcess(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("a\nb"))
	f.Add([]byte("  two words  \r\n"))
	f.Add([]byte("caf\xe9"))
	f.Add([]byte("GIF89a text"))
	f.Add(encodePNG(f, gradient(3, 2)))
	f.Add(encodePNG(f, gradient(300, 20)))
	f.Add(encodeJPEG(f, gradient(8, 8)))
	f.Add(encodeGIF(f, gradient(5, 7)))
	f.Add(progressiveJPEG(24, 16, 3))
	f.Add(bombPNG(50000, 50000))
	f.Add(bombGIF(2000, 2000))

	lim := attachment.Limits{MaxPixels: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := attachment.Process(inputOf(data, "application/octet-stream"), lim)
		if err != nil {
			var perr *attachment.PermanentError
			if !errors.As(err, &perr) || !(errors.Is(err, attachment.ErrCorruptImage) || errors.Is(err, attachment.ErrImageTooLarge)) {
				t.Fatalf("unexpected error %T: %v", err, err)
			}
			if perr.Reason == "" {
				t.Fatal("a permanent error without a reason")
			}
			return
		}
		if res.DetectedType == "" {
			t.Fatal("no detected type")
		}
		if strings.HasPrefix(res.DetectedType, "text/") != (res.Text != nil) {
			t.Fatalf("detected %q with text %v", res.DetectedType, res.Text)
		}
		if th := res.Thumbnail; th != nil {
			if th.Width < 1 || th.Height < 1 || th.Width > attachment.ThumbnailMaxSide || th.Height > attachment.ThumbnailMaxSide {
				t.Fatalf("thumbnail %dx%d", th.Width, th.Height)
			}
			cfg, err := png.DecodeConfig(bytes.NewReader(th.PNG))
			if err != nil || cfg.Width != th.Width || cfg.Height != th.Height {
				t.Fatalf("thumbnail PNG: %v, %dx%d for %dx%d", err, cfg.Width, cfg.Height, th.Width, th.Height)
			}
		}
		if tx := res.Text; tx != nil {
			s := string(data)
			lines := strings.Count(s, "\n")
			if s != "" && !strings.HasSuffix(s, "\n") {
				lines++
			}
			runes := []rune(s)
			preview := string(runes[:min(len(runes), attachment.PreviewMaxChars)])
			if tx.Lines != lines || tx.Words != len(strings.Fields(s)) || tx.Preview != preview {
				t.Fatalf("text %+v for %q", *tx, s)
			}
			if !utf8.ValidString(tx.Preview) {
				t.Fatal("preview is not UTF-8")
			}
		}
		js, err := res.JSON()
		if err != nil || !jsontext.Value(js).IsValid() {
			t.Fatalf("JSON %s: %v", js, err)
		}
	})
}
