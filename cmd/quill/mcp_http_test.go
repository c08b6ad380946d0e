package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/clitest"
)

type bearer struct{ token string }

func (bt bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+bt.token)
	return http.DefaultTransport.RoundTrip(r)
}

var listening = regexp.MustCompile(`"addr":"([^"]+)"`)

// quill mcp --http serves the tools over streamable HTTP with each
// caller's token, never QUILL_TOKEN, and stops on SIGTERM (ctx).
func TestMCPOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr clitest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"mcp", "--http", "127.0.0.1:0", "--allowed-origins", "https://agent.example.com, http://localhost:3000", "--session-timeout", "10m",
			"--read-timeout", "20s", "--write-timeout", "40s", "--idle-timeout", "1m", "--max-connections", "64"},
			func(k string) string { return b.env[k] }, strings.NewReader(""), io.Discard, &stderr)
	}()
	var addr string
	require.Eventually(t, func() bool {
		m := listening.FindStringSubmatch(stderr.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "stderr: %s", stderr.String())
	require.Contains(t, stderr.String(), "QUILL_TOKEN and QUILL_TOKEN_FILE are ignored with --http")
	endpoint := "http://" + addr + "/mcp"

	_, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
	require.Error(t, err, "QUILL_TOKEN is not lent to a caller without Authorization")

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer{b.api.Token}}, MaxRetries: -1}, nil)
	require.NoError(t, err)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_note", Arguments: map[string]any{"title": "over http"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Equal(t, 1, b.api.Notes(t, "over http"))

	// --allowed-origins: browser pages of those origins may call, others not.
	for origin, want := range map[string]int{"https://agent.example.com": http.StatusOK, "http://localhost:3000": http.StatusOK, "https://evil.example": http.StatusForbidden} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+b.api.Token)
		req.Header.Set("Origin", origin)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		require.Equal(t, want, res.StatusCode, origin)
	}

	cancel() // what SIGTERM does in main
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("quill mcp --http did not stop")
	}
	_ = cs.Close()
}

func TestMCPHTTPBadFlagsAreUsageErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{
		{"mcp", "--http", ""},
		{"mcp", "--http", "nonsense"},
		{"mcp", "--http", "127.0.0.1:99999"},
		{"mcp", "--http", "127.0.0.1:0", "--token", "qt_x"},
		{"mcp", "--http", "127.0.0.1:0", "--url", "ftp://x"},
		{"mcp", "--http", "127.0.0.1:0", "--allowed-origins", "agent.example.com"},
		{"mcp", "--http", "127.0.0.1:0", "--allowed-origins", "https://a.example/path"},
		{"mcp", "--http", "127.0.0.1:0", "--session-timeout", "0s"},
		{"mcp", "--http", "127.0.0.1:0", "--session-timeout", "soon"},
		{"mcp", "--http", "127.0.0.1:0", "--max-connections", "0"},
		{"mcp", "--http", "127.0.0.1:0", "--trusted-proxies", "10.0.0.0/33"},
		{"mcp", "extra"},
	} {
		_, errOut, code := b.quill(args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(errOut), "\n")+1, "%v: one line: %q", args, errOut)
	}
	// A flag without its value prints the usage too, as for every command.
	_, errOut, code := b.quill("mcp", "--http")
	require.Equal(t, exitUsage, code, errOut)
}

// A call the host cancels mid-flight, then a restart of quill mcp, then the
// same request again without a key: one note.
func TestMCPCancelledCallAndRestartMakeOneNote(t *testing.T) {
	t.Parallel()
	b := setup(t)
	arrived, release := b.api.HoldFirstCreate(t)
	args := map[string]any{"title": "cancelled, restarted"}

	cs, stop := b.startStdio(t)
	callCtx, cancelCall := context.WithCancel(t.Context())
	called := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "create_note", Arguments: args})
		called <- err
	}()
	<-arrived
	cancelCall()
	require.Error(t, <-called)
	close(release)
	require.Eventually(t, func() bool { return b.api.Notes(t, "cancelled, restarted") == 1 }, 10*time.Second, 10*time.Millisecond)
	stop()

	cs, stop = b.startStdio(t)
	defer stop()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_note", Arguments: args})
	require.NoError(t, err)
	require.False(t, res.IsError)
	raw, _ := json.Marshal(res.StructuredContent)
	require.Contains(t, string(raw), `"resumed":true`)
	require.Equal(t, 1, b.api.Notes(t, "cancelled, restarted"))
}

// startStdio runs quill mcp on pipes and connects an MCP client; stop ends
// both and waits for the program to return.
func (b *testBundle) startStdio(t *testing.T) (*mcp.ClientSession, func()) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"mcp"}, func(k string) string { return b.env[k] }, inR, outW, io.Discard)
		_ = outW.Close()
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
		Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	require.NoError(t, err)
	return cs, func() {
		_ = cs.Close()
		_ = inW.Close()
		cancel()
		require.NoError(t, <-done)
	}
}
