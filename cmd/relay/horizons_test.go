package main

import (
	"bytes"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
)

// horizonPairs reads the table of docs/guarantees.md "Horizons, and how they
// nest" and returns, for each pair the relay checks, the settings it names
// (sorted, joined by spaces).
func horizonPairs(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/guarantees.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "## Horizons, and how they nest")
	require.True(t, ok, "the Horizons section")
	section, _, _ = strings.Cut(section, "\n## ")
	setting := regexp.MustCompile("`(QUILL_[A-Z_]+)`")
	var pairs []string
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.TrimSpace(cells[2]) != "relay" {
			continue
		}
		var names []string
		for _, m := range setting.FindAllStringSubmatch(cells[1], -1) {
			names = append(names, m[1])
		}
		slices.Sort(names)
		pairs = append(pairs, strings.Join(names, " "))
	}
	return pairs
}

// Every pair of horizons the docs say the relay checks is refused at start
// (exit 2, one line) by a message naming each setting of the pair, and the
// relay checks no pair the docs leave out. The outbox retention nests with
// nothing: the relay starts with one shorter than any key retention
// (decision 0048).
func TestHorizonRefusalsAgreeWithTheDocs(t *testing.T) {
	t.Parallel()
	// Nothing listens here: a relay past its checks fails to connect
	// (exit 1), not with a usage error (exit 2).
	base := map[string]string{
		"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2",
		"NATS_URL":     "nats://127.0.0.1:1",
	}
	// A setting that breaks each pair, by the pair's settings.
	breaks := map[string]map[string]string{
		// The relay's worst republish delay is its fixed timings' sum (71s).
		"QUILL_DUPLICATE_WINDOW":                      {"QUILL_DUPLICATE_WINDOW": "1m"},
		"QUILL_DUPLICATE_WINDOW QUILL_STREAM_MAX_AGE": {"QUILL_STREAM_MAX_AGE": "5m"},
		"QUILL_INBOX_RETENTION QUILL_STREAM_MAX_AGE":  {"QUILL_INBOX_RETENTION": "100h"},
	}
	pairs := horizonPairs(t)
	require.ElementsMatch(t, slices.Collect(maps.Keys(breaks)), pairs, "the docs' relay rows and this test's cases")
	run := func(t *testing.T, extra map[string]string) (string, error) {
		t.Helper()
		g := func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		}
		_, _, err := clitest.RunOut(t, run, g)
		var stderr bytes.Buffer
		exitCode(err, &stderr)
		return stderr.String(), err
	}
	for _, pair := range pairs {
		t.Run(pair, func(t *testing.T) {
			t.Parallel()
			stderr, err := run(t, breaks[pair])
			var uerr cli.UsageError
			require.ErrorAs(t, err, &uerr)
			for name := range strings.FieldsSeq(pair) {
				require.Contains(t, stderr, name)
			}
			require.NotContains(t, strings.TrimSpace(stderr), "\n", "one line")
		})
	}
	t.Run("outbox retention", func(t *testing.T) {
		t.Parallel()
		stderr, err := run(t, map[string]string{"QUILL_OUTBOX_RETENTION": "1m", "QUILL_KEY_RETENTION": "720h"})
		require.Error(t, err, "nothing listens")
		var uerr cli.UsageError
		require.NotErrorAs(t, err, &uerr, "no horizon refused: %s", stderr)
	})
}
