package attachment

import (
	"bytes"
	"net/http"
	"strings"
	"unicode/utf8"
)

// kind is what Process does with a detected type.
type kind int

const (
	kindOther kind = iota
	kindText
	kindImage
)

var (
	magicPNG   = []byte("\x89PNG\r\n\x1a\n")
	magicJPEG  = []byte{0xFF, 0xD8, 0xFF}
	magicGIF87 = []byte("GIF87a")
	magicGIF89 = []byte("GIF89a")
)

// detect decides the content type of data; the rules are in the package
// documentation.
func detect(data []byte) (string, kind) {
	if isText(data) {
		if ct := http.DetectContentType(data); strings.HasPrefix(ct, "text/") {
			return ct, kindText
		}
		return TypeText, kindText
	}
	switch {
	case bytes.HasPrefix(data, magicPNG):
		return TypePNG, kindImage
	case bytes.HasPrefix(data, magicJPEG):
		return TypeJPEG, kindImage
	case bytes.HasPrefix(data, magicGIF87), bytes.HasPrefix(data, magicGIF89):
		return TypeGIF, kindImage
	}
	ct := http.DetectContentType(data)
	if strings.HasPrefix(ct, "text/") {
		// DetectContentType looked at 512 bytes and did not validate
		// UTF-8; isText looked at all of them.
		return TypeOctetStream, kindOther
	}
	return ct, kindOther
}

// isText reports whether data is valid UTF-8 without a NUL byte.
func isText(data []byte) bool {
	return bytes.IndexByte(data, 0) < 0 && utf8.Valid(data)
}
