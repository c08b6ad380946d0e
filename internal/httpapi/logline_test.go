package httpapi_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
)

// The request log line's duration_ms is a JSON number of milliseconds, no
// longer than the request took.
func TestRequestLogLineDuration(t *testing.T) {
	t.Parallel()
	var logs clitest.SyncBuffer
	o := standard
	o.log = &logs
	b := setup(t, o)
	start := time.Now()
	b.api.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v1/notes/00000000-0000-0000-0000-000000000000", nil))
	took := time.Since(start)
	type requestLine struct {
		Route      string   `json:"route"`
		Status     int      `json:"status"`
		DurationMS *float64 `json:"duration_ms"`
	}
	var line *requestLine
	sc := bufio.NewScanner(bytes.NewBufferString(logs.String()))
	for sc.Scan() {
		var l requestLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), sc.Text())
		if l.Route != "" {
			require.Nil(t, line, "two request lines: %s", logs.String())
			line = &l
		}
	}
	require.NotNil(t, line, "no request line: %s", logs.String())
	require.Equal(t, http.StatusUnauthorized, line.Status)
	require.NotNil(t, line.DurationMS, logs.String())
	require.GreaterOrEqual(t, *line.DurationMS, 0.0)
	require.LessOrEqual(t, *line.DurationMS, float64(took.Microseconds())/1000)
}
