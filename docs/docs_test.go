package docs_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, seen from this package's directory.
const root = ".."

// maxREADMELines is the most lines README.md may have: the README is a page,
// the reference lives in docs/.
const maxREADMELines = 150

func TestREADMEIsAPage(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := bytes.Count(data, []byte("\n"))
	if len(data) > 0 && data[len(data)-1] != '\n' {
		n++
	}
	if n > maxREADMELines {
		t.Errorf("README.md has %d lines, more than %d: move the detail into docs/", n, maxREADMELines)
	}
}

// TestRelativeLinksResolve checks every relative link of the README, of
// docs/**/*.md and of bench/README.md: the file or directory must exist and,
// for a link into a Markdown file, its #anchor must name a heading there.
func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	files := markdownFiles(t)
	anchors := map[string]map[string]bool{} // slash path from root → anchors
	for _, f := range files {
		a, err := fileAnchors(f)
		if err != nil {
			t.Fatal(err)
		}
		anchors[f] = a
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			t.Parallel()
			ls, err := fileLinks(f)
			if err != nil {
				t.Fatal(err)
			}
			if f == "README.md" && len(ls) == 0 {
				t.Fatal("README.md has no relative links: the link scanner is broken")
			}
			for _, l := range ls {
				if err := resolve(f, l.target, anchors); err != nil {
					t.Errorf("%s:%d: link %q: %v", f, l.line, l.target, err)
				}
			}
		})
	}
}

// markdownFiles lists the checked files as slash paths from the root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "bench/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// resolve reports why target, a link in the file from, does not resolve.
// anchors holds the anchors of every checked Markdown file; a link into a
// Markdown file that is not checked has its anchors read on demand.
func resolve(from, target string, anchors map[string]map[string]bool) error {
	p, frag, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(p)
	if err != nil {
		return err
	}
	dest := from
	if p != "" {
		dest = path.Clean(path.Join(path.Dir(from), p))
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return fmt.Errorf("leaves the repository")
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
			return fmt.Errorf("no such file or directory %s", dest)
		}
	}
	if frag == "" || !strings.HasSuffix(dest, ".md") {
		return nil
	}
	a, ok := anchors[dest]
	if !ok {
		if a, err = fileAnchors(dest); err != nil {
			return err
		}
	}
	frag, err = url.PathUnescape(frag)
	if err != nil {
		return err
	}
	if !a[strings.ToLower(frag)] {
		return fmt.Errorf("%s has no heading with the anchor #%s", dest, frag)
	}
	return nil
}

type link struct {
	line   int
	target string
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an optional title.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refLink matches a reference definition: [label]: target
	refLink   = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$`)
	codeSpan  = regexp.MustCompile("`+[^`]*`+")
	heading   = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	htmlID    = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	mdLinkTxt = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag   = regexp.MustCompile(`<[^>]*>`)
	scheme    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// fileLinks returns the relative links of a Markdown file, outside fenced
// code blocks and code spans.
func fileLinks(name string) ([]link, error) {
	var ls []link
	err := eachProseLine(name, func(n int, line string) {
		line = codeSpan.ReplaceAllString(line, "code")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, tg := range targets {
			if tg == "" || scheme.MatchString(tg) || strings.HasPrefix(tg, "//") {
				continue
			}
			ls = append(ls, link{line: n, target: tg})
		}
	})
	return ls, err
}

// fileAnchors returns the anchors GitHub gives the headings of a Markdown
// file (and any <a id> or <a name> in it).
func fileAnchors(name string) (map[string]bool, error) {
	anchors := map[string]bool{}
	seen := map[string]int{}
	err := eachProseLine(name, func(_ int, line string) {
		for _, m := range htmlID.FindAllStringSubmatch(line, -1) {
			anchors[strings.ToLower(m[1])] = true
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			return
		}
		s := slug(m[2])
		if k := seen[s]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	})
	return anchors, err
}

// slug is GitHub's anchor for a heading's text: the rendered text in lower
// case, without characters other than letters, marks, numbers, connector
// punctuation, spaces and hyphens, and with each space turned into a hyphen.
func slug(text string) string {
	text = mdLinkTxt.ReplaceAllString(text, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-', unicode.IsLetter(r), unicode.IsMark(r), unicode.IsNumber(r), unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// eachProseLine calls f with every line of a Markdown file (slash path from
// the root) that is outside a fenced code block.
func eachProseLine(name string, f func(n int, line string)) error {
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if err != nil {
		return err
	}
	var fence string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		f(n, line)
	}
	return sc.Err()
}

func TestSlug(t *testing.T) {
	t.Parallel()
	tests := []struct {
		heading, want string
	}{
		{"The HTTP API", "the-http-api"},
		{"Relay benchmark (`make bench-relay`)", "relay-benchmark-make-bench-relay"},
		{"Auditing: `api audit`", "auditing-api-audit"},
		{"Retention: what a retry after expiry does", "retention-what-a-retry-after-expiry-does"},
		{"`QUILL_KEY_RETENTION` and tombstones", "quill_key_retention-and-tombstones"},
		{"0011 — Relay claims", "0011--relay-claims"},
		{"Results of the final relay (2026-11-30)", "results-of-the-final-relay-2026-11-30"},
		{"See [the relay](relay.md) *now*", "see-the-relay-now"},
	}
	for _, tt := range tests {
		t.Run(tt.heading, func(t *testing.T) {
			t.Parallel()
			if got := slug(tt.heading); got != tt.want {
				t.Errorf("slug(%q) = %q, want %q", tt.heading, got, tt.want)
			}
		})
	}
}

func TestResolveReportsBrokenLinks(t *testing.T) {
	t.Parallel()
	anchors := map[string]map[string]bool{"docs/x.md": {"here": true}}
	tests := []struct {
		from, target string
		ok           bool
	}{
		{"README.md", "docs/idempotency.md", true},
		{"README.md", "docs/no-such-page.md", false},
		{"README.md", "../outside.md", false},
		{"docs/x.md", "#here", true},
		{"docs/x.md", "#nowhere", false},
		{"docs/relay.md", "../bench/README.md#relay-benchmark-make-bench-relay", true},
		{"docs/relay.md", "../bench/README.md#no-such-heading", false},
		{"docs/relay.md", "decisions/", true},
	}
	for _, tt := range tests {
		t.Run(tt.from+"→"+tt.target, func(t *testing.T) {
			t.Parallel()
			err := resolve(tt.from, tt.target, anchors)
			if (err == nil) != tt.ok {
				t.Errorf("resolve(%q, %q) = %v, want ok=%v", tt.from, tt.target, err, tt.ok)
			}
		})
	}
}
