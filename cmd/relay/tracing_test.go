package main

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/natstest"
)

// With an OTLP endpoint the relay makes a span of each publish and exports
// them by the time it has stopped; the start-up says where spans go.
func TestRelayExportsPublishSpans(t *testing.T) {
	t.Parallel()
	collector := clitest.NewCollector(t)
	w := newWorld(t)
	w.vars["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = collector.URL + "/traces"
	p := clitest.Start(t, run, clitest.Env(w.vars))
	waitStatus(t, "http://"+w.admin+"/readyz", http.StatusOK)
	id := w.write(w.tenant)
	w.waitPublished(1)
	require.NoError(t, p.Stop())
	require.Equal(t, []string{"POST /traces"}, collector.Posts(), "the publish span, flushed at exit")
	require.Contains(t, p.Stderr.String(), `"exporter":"otlp `+collector.URL+`/traces"`)
	msgs := natstest.StreamMessages(t, w.js, w.stream, "")
	require.Len(t, msgs, 1)
	require.Equal(t, id.String(), msgs[0].Header.Get("Nats-Msg-Id"))
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, msgs[0].Header.Get("traceparent"),
		"an event written without a trace starts one at its publish")
}
