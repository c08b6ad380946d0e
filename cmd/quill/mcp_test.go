package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// quill mcp speaks MCP on its stdin and stdout.
func TestMCPOverStdio(t *testing.T) {
	t.Parallel()
	b := setup(t)
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
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_note", Arguments: map[string]any{"title": "over stdio"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.True(t, strings.Contains(res.Content[0].(*mcp.TextContent).Text, "completed"))
	require.Equal(t, 1, b.api.Notes(t, "over stdio"))
	_ = cs.Close()
	_ = inW.Close()
	cancel()
	require.NoError(t, <-done)
}
