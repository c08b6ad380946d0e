package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
)

// With an OTLP endpoint set, serve traces its requests and exports the
// spans by the time it has stopped; the start-up says tracing is on, and a
// request's log line names its trace. A bad OTEL_* setting is a usage
// error before anything starts.
func TestServeExportsSpansToTheOTLPEndpoint(t *testing.T) {
	t.Parallel()
	collector := clitest.NewCollector(t)

	vars := map[string]string{"DATABASE_URL": dbtest.Schema(t), "QUILL_HTTP_ADDR": clitest.FreeAddr(t), "QUILL_ADMIN_ADDR": clitest.FreeAddr(t),
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL}
	tok := createToken(t, clitest.Env(vars))
	p := startServe(t, vars)
	res, body := post(t, "http://"+vars["QUILL_HTTP_ADDR"], tok, "traced-1", `{"title":"traced"}`)
	require.Equal(t, http.StatusCreated, res.StatusCode, body)
	require.NoError(t, p.Stop())

	require.Contains(t, collector.Posts(), "POST /v1/traces", "the spans were flushed at exit")
	logs := p.Stderr.String()
	require.Contains(t, logs, `"exporter":"otlp `+collector.URL+`/v1/traces"`)
	require.Regexp(t, `"message":"tracing on"`, logs)
	require.Regexp(t, `"trace_id":"[0-9a-f]{32}","span_id":"[0-9a-f]{16}","time":"[^"]+","message":"request"`, logs)

	vars["OTEL_TRACES_SAMPLER"] = "sometimes"
	_, _, err := clitest.RunOut(t, run, clitest.Env(vars), "serve")
	require.ErrorContains(t, err, "OTEL_TRACES_SAMPLER")
}
