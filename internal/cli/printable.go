package cli

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Printable returns s with every byte sequence that is not printable
// Unicode (control characters, ESC and so terminal escape sequences,
// invalid UTF-8) and every backslash escaped as strconv.Quote would, and
// the rest as it is, so that an ordinary value reads as written: for text
// from outside (an error message, an event's member) printed on a terminal.
func Printable(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == '\\':
			b.WriteString(`\\`)
		case strconv.IsPrint(r):
			b.WriteString(s[:n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		s = s[n:]
	}
	return b.String()
}
