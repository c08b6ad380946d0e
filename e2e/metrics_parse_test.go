package e2e

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	in := `# HELP quill_worker_messages_total Messages.
# TYPE quill_worker_messages_total counter
quill_worker_messages_total{result="duplicate"} 3
quill_worker_messages_total{result="processed"} 1039
quill_relay_duplicates_total 491
quill_http_requests_total{code="201",method="POST",route="/v1/notes"} 7 1712345678
quill_x{b="2",a="q\"uote"} 1.5e+02
`
	s := parseMetrics(strings.NewReader(in))
	require.Equal(t, 3.0, s[`quill_worker_messages_total{result="duplicate"}`])
	require.Equal(t, 491.0, s["quill_relay_duplicates_total"])
	require.Equal(t, 7.0, s[`quill_http_requests_total{code="201",method="POST",route="/v1/notes"}`])
	name, labels := splitKey(seriesKey("quill_x", map[string]string{"a": `q"uote`, "b": "2"}))
	require.Equal(t, "quill_x", name)
	require.Equal(t, map[string]string{"a": `q"uote`, "b": "2"}, labels)
	require.Equal(t, 150.0, s[seriesKey("quill_x", map[string]string{"a": `q"uote`, "b": "2"})])

	sc := &scraper{last: map[string]map[int]sample{"w": {1: s, 2: {`quill_worker_messages_total{result="duplicate"}`: 2}}}}
	require.Equal(t, 5.0, sc.Total(&daemon{name: "w"}, "quill_worker_messages_total", map[string]string{"result": "duplicate"}))
	require.Equal(t, 1044.0, sc.Total(&daemon{name: "w"}, "quill_worker_messages_total", nil))
}
