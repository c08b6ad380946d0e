package main

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// quill mcp speaks MCP on its stdin and stdout.
func TestMCPOverStdio(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cs, stop := b.startStdio(t)
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_note", Arguments: map[string]any{"title": "over stdio"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.True(t, strings.Contains(res.Content[0].(*mcp.TextContent).Text, "completed"))
	require.Equal(t, 1, b.api.Notes(t, "over stdio"))
	stop()
}
