package docs_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// decisionsDir is the directory of the decision records, from the root.
const decisionsDir = "docs/decisions"

var (
	// recordFile is a decision record's file name: its number and a short title.
	recordFile = regexp.MustCompile(`^(\d{4})-[a-z0-9-]+\.md$`)
	// recordRef is a link to a decision record as a status line or the
	// index writes it: [NNNN](NNNN-short-title.md).
	recordRef = regexp.MustCompile(`\[(\d{4})\]\(((\d{4})-[a-z0-9-]+\.md)\)`)
	// indexRow is a row of the index: | [NNNN](file) | decision |
	indexRow = regexp.MustCompile(`^\|\s*\[(\d{4})\]\(([^)]+)\)\s*\|(.*)\|\s*$`)
	// indexNote is the status note that ends an index row's decision when the
	// record is not simply accepted.
	indexNote = regexp.MustCompile(`\*(superseded|amended) by ([^*]+)\*\s*$`)
)

// status is what a record's Status line says.
type status struct {
	kind string   // "accepted", "amended" or "superseded"; "" if unreadable
	by   []string // the numbers of the records that amend or supersede it
}

func (s status) String() string {
	if s.kind == "accepted" {
		return s.kind
	}
	return s.kind + " by " + strings.Join(s.by, ", ")
}

// record is one decision record file.
type record struct {
	num, file string
	status    status
}

// TestDecisionRecordsHaveStatus checks that every decision record has, one
// blank line under its title, a one-line Status line in one of three forms:
//
//	Status: accepted [(note)]
//	Status: accepted, amended by [N](N-….md) [(which part)], [M](M-….md) … [; more]
//	Status: superseded by [N](N-….md) … [; more]
//
// and that every record an "amended by" or "superseded by" names exists and
// is a later one, so that a stale record never reads as current.
func TestDecisionRecordsHaveStatus(t *testing.T) {
	t.Parallel()
	records, errs := readRecords(t)
	for _, err := range errs {
		t.Error(err)
	}
	if len(records) == 0 {
		t.Fatal("no decision records found: the scanner is broken")
	}
}

// TestDecisionIndexShowsStatus checks that docs/decisions/README.md has one
// row per record, linking to its file, and that the row shows the record's
// status: a row of an amended or superseded record ends in
// "*amended by [N](file)*" or "*superseded by [N](file)*", naming the records
// its Status line names; a row without that note is an accepted record.
func TestDecisionIndexShowsStatus(t *testing.T) {
	t.Parallel()
	records, _ := readRecords(t)
	byNum := map[string]record{}
	for _, r := range records {
		byNum[r.num] = r
	}
	data, err := os.ReadFile(filepath.Join(root, decisionsDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		m := indexRow.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		num, file, cell := m[1], m[2], m[3]
		if rows[num] {
			t.Errorf("README.md:%d: a second row for %s", n, num)
		}
		rows[num] = true
		r, ok := byNum[num]
		if !ok {
			t.Errorf("README.md:%d: row %s has no record file", n, num)
			continue
		}
		if file != r.file {
			t.Errorf("README.md:%d: row %s links to %s, want %s", n, num, file, r.file)
		}
		if got := indexStatus(cell); r.status.kind != "" && got.String() != r.status.String() {
			t.Errorf("README.md:%d: row %s shows %q, the record's Status line says %q", n, num, got, r.status)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range records {
		if !rows[r.num] {
			t.Errorf("README.md has no row for %s", r.file)
		}
	}
}

// indexStatus reads the status an index row's decision cell shows.
func indexStatus(cell string) status {
	m := indexNote.FindStringSubmatch(cell)
	if m == nil {
		return status{kind: "accepted"}
	}
	s := status{kind: m[1]}
	for _, ref := range recordRef.FindAllStringSubmatch(m[2], -1) {
		s.by = append(s.by, ref[1])
	}
	return s
}

// readRecords reads every decision record's number, file and status, and
// returns the problems it found with their Status lines; a record whose
// Status line has a problem has an empty status kind.
func readRecords(t *testing.T) ([]record, []error) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, decisionsDir))
	if err != nil {
		t.Fatal(err)
	}
	exists := map[string]string{} // number → file
	var files []string
	for _, e := range entries {
		if m := recordFile.FindStringSubmatch(e.Name()); m != nil {
			if other, dup := exists[m[1]]; dup {
				t.Fatalf("two records numbered %s: %s and %s", m[1], other, e.Name())
			}
			exists[m[1]] = e.Name()
			files = append(files, e.Name())
		} else if e.Name() != "README.md" {
			t.Errorf("%s/%s is not named NNNN-short-title.md", decisionsDir, e.Name())
		}
	}
	var (
		records []record
		errs    []error
	)
	for _, f := range files {
		num := f[:4]
		r := record{num: num, file: f}
		line, err := statusLine(filepath.Join(root, decisionsDir, f), num)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
		} else if r.status, err = parseStatus(line, num, exists); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q: %w", f, line, err))
		}
		records = append(records, r)
	}
	return records, errs
}

// statusLine returns the Status line of the record in name, checking that the
// file begins with its title "# NNNN — …" and that the first line after the
// title's blank line is the Status line.
func statusLine(name, num string) (string, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	lines := strings.Split(string(data), "\n")
	if !strings.HasPrefix(lines[0], "# "+num+" — ") {
		return "", fmt.Errorf("the first line is %q, want the title \"# %s — …\"", lines[0], num)
	}
	if len(lines) < 3 || lines[1] != "" || !strings.HasPrefix(lines[2], "Status:") {
		return "", fmt.Errorf("no \"Status:\" line right under the title (after one blank line)")
	}
	if len(lines) > 3 && lines[3] != "" {
		return "", fmt.Errorf("the Status line goes on over a second line; keep it to one")
	}
	return lines[2], nil
}

// parseStatus reads a Status line of record num; exists maps the numbers of
// the records there are to their files.
func parseStatus(line, num string, exists map[string]string) (status, error) {
	rest, _ := strings.CutPrefix(line, "Status: ")
	var s status
	switch {
	case strings.HasPrefix(rest, "accepted, amended by "):
		s.kind, rest = "amended", strings.TrimPrefix(rest, "accepted, amended by ")
	case strings.HasPrefix(rest, "superseded by "):
		s.kind, rest = "superseded", strings.TrimPrefix(rest, "superseded by ")
	case strings.HasPrefix(rest, "accepted"):
		s.kind, rest = "accepted", strings.TrimPrefix(rest, "accepted")
		if rest != "" && !(strings.HasPrefix(rest, " (") && strings.HasSuffix(rest, ")")) {
			return s, fmt.Errorf("after \"accepted\" only a parenthesised note may follow")
		}
		return s, nil
	default:
		return s, fmt.Errorf(`want "Status: accepted", "Status: accepted, amended by [N](file)" or "Status: superseded by [N](file)"`)
	}
	for {
		m := recordRef.FindStringSubmatchIndex(rest)
		if m == nil || m[0] != 0 {
			return s, fmt.Errorf("%q must be followed by links [N](N-….md)", s.kind+" by")
		}
		label, file, fileNum := rest[m[2]:m[3]], rest[m[4]:m[5]], rest[m[6]:m[7]]
		switch {
		case label != fileNum:
			return s, fmt.Errorf("the link [%s] goes to %s", label, file)
		case exists[label] != file:
			return s, fmt.Errorf("%s by %s: there is no record %s", s.kind, label, file)
		case label <= num:
			return s, fmt.Errorf("%s by %s: only a later record can amend or supersede %s", s.kind, label, num)
		}
		if !slices.Contains(s.by, label) {
			s.by = append(s.by, label)
		}
		rest = rest[m[1]:]
		if strings.HasPrefix(rest, " (") {
			n := closingParen(rest[1:])
			if n < 0 {
				return s, fmt.Errorf("a note after [%s] has no closing parenthesis", label)
			}
			rest = rest[1+n+1:]
		}
		sep := ""
		for _, p := range []string{", and ", ", ", " and "} {
			if strings.HasPrefix(rest, p) {
				sep = p
				break
			}
		}
		if sep == "" {
			break
		}
		rest = rest[len(sep):]
	}
	if rest != "" && !strings.HasPrefix(rest, "; ") {
		return s, fmt.Errorf("after the links only a parenthesised note per link and a final \"; …\" clause may follow")
	}
	return s, nil
}

// closingParen returns the index in s, which begins with "(", of the
// parenthesis that closes it, or -1.
func closingParen(s string) int {
	depth := 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	exists := map[string]string{
		"0010": "0010-a.md",
		"0020": "0020-b.md",
		"0030": "0030-c.md",
		"0040": "0040-d.md",
	}
	tests := []struct {
		line string
		want string // the status, or "" for an error
	}{
		{"Status: accepted", "accepted"},
		{"Status: accepted (amends [0010](0010-a.md)'s part)", "accepted"},
		{"Status: accepted, amended by [0030](0030-c.md)", "amended by 0030"},
		{"Status: accepted, amended by [0030](0030-c.md) (its cap)", "amended by 0030"},
		{"Status: superseded by [0030](0030-c.md)", "superseded by 0030"},
		{"Status: superseded by [0030](0030-c.md) and [0040](0040-d.md)", "superseded by 0030, 0040"},
		{"Status: accepted, amended by [0030](0030-c.md) (its cap), [0040](0040-d.md) (its `x (y)`)", "amended by 0030, 0040"},
		{"Status: accepted, amended by [0030](0030-c.md) (its cap); it replaces part of [0010](0010-a.md)", "amended by 0030"},
		{"Status: accepted, amended by [0030](0030-c.md) (its cap", ""},
		{"Status: accepted, amended by [0030](0030-c.md), see below", ""},
		{"Status: accepted, amended by [0030](0030-c.md) and more", ""},
		{"Status: Accepted", ""},
		{"Status: accepted but stale", ""},
		{"Status: superseded", ""},
		{"Status: superseded by 0030", ""},
		{"Status: superseded by [0050](0050-e.md)", ""},     // no such record
		{"Status: superseded by [0030](0020-b.md)", ""},     // label and file disagree
		{"Status: superseded by [0010](0010-a.md)", ""},     // an earlier record
		{"Status: superseded by [0020](0020-b.md)", ""},     // itself
		{"Status: amended by [0030](0030-c.md)", ""},        // the form is "accepted, amended by"
		{"Status: superseded by see [0030](0030-c.md)", ""}, // not a link first
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			t.Parallel()
			s, err := parseStatus(tt.line, "0020", exists)
			got := ""
			if err == nil {
				got = s.String()
			}
			if got != tt.want {
				t.Errorf("parseStatus(%q) = %q, %v; want %q", tt.line, got, err, tt.want)
			}
		})
	}
}

func TestIndexStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cell, want string
	}{
		{" The claim is one round trip ", "accepted"},
		{" Sessions (replaces part of 0062) ", "accepted"},
		{" The claim *superseded by [0064](0064-a.md)* ", "superseded by 0064"},
		{" The cap *amended by [0068](0068-a.md), [0072](0072-b.md)* ", "amended by 0068, 0072"},
	}
	for _, tt := range tests {
		t.Run(tt.cell, func(t *testing.T) {
			t.Parallel()
			if got := indexStatus(tt.cell).String(); got != tt.want {
				t.Errorf("indexStatus(%q) = %q, want %q", tt.cell, got, tt.want)
			}
		})
	}
}
