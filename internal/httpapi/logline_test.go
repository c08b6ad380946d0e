package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/notes"
)

// The request log line's duration_ms is a JSON number of milliseconds.
func TestRequestLogLineDuration(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	m := metrics.NewAPI(metrics.NewRegistry(), contract.ActionCreateNote, contract.ActionDeleteNote)
	svc, err := notes.NewService(pool, notes.Config{}, log)
	require.NoError(t, err)
	h := httpapi.NewServer(httpapi.Deps{Pool: pool, Auth: auth.NewAuthenticator(pool, 5*time.Second), Notes: svc, Log: log, Metrics: m})
	start := time.Now()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v1/notes/00000000-0000-0000-0000-000000000000", nil))
	took := time.Since(start)
	var line struct {
		Status     int      `json:"status"`
		DurationMS *float64 `json:"duration_ms"`
	}
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &line), buf.String())
	require.Equal(t, http.StatusUnauthorized, line.Status)
	require.NotNil(t, line.DurationMS, buf.String())
	require.GreaterOrEqual(t, *line.DurationMS, 0.0)
	require.LessOrEqual(t, *line.DurationMS, float64(took.Microseconds())/1000)
}
