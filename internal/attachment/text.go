package attachment

import (
	"bytes"
	"unicode"
	"unicode/utf8"
)

// asciiSpace marks the ASCII characters unicode.IsSpace accepts: the six of
// wc's C locale.
var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// textStats computes the statistics of data, which must be valid UTF-8.
func textStats(data []byte) *TextStats {
	lines := bytes.Count(data, []byte{'\n'})
	if len(data) > 0 && data[len(data)-1] != '\n' {
		lines++
	}

	words, inWord := 0, false
	for i := 0; i < len(data); {
		var space bool
		if c := data[i]; c < utf8.RuneSelf {
			space = asciiSpace[c]
			i++
		} else {
			r, n := utf8.DecodeRune(data[i:])
			space = unicode.IsSpace(r)
			i += n
		}
		if space {
			inWord = false
		} else if !inWord {
			inWord = true
			words++
		}
	}

	end := 0
	for n := 0; n < PreviewMaxChars && end < len(data); n++ {
		if data[end] < utf8.RuneSelf {
			end++
		} else {
			_, size := utf8.DecodeRune(data[end:])
			end += size
		}
	}
	return &TextStats{Lines: lines, Words: words, Preview: string(data[:end])}
}
