package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/mcpserver"
)

// remoteBundle is a real API with two tenants and quill's MCP server over
// streamable HTTP in front of it.
type remoteBundle struct {
	t          *testing.T
	api        *apitest.API
	tokenB     string
	tenantB    string
	journalDir string
	endpoint   string
	stop       func() error
	// http are the connections' settings; set them before start.
	http httpserve.Settings
}

func setupRemote(t *testing.T) *remoteBundle {
	t.Helper()
	b := &remoteBundle{t: t, api: apitest.Start(t), journalDir: t.TempDir(), tenantB: "t-b-" + strings.ToLower(uuid.NewString()[:8])}
	var err error
	b.tokenB, err = auth.Create(context.Background(), b.api.Pool, b.tenantB, time.Now())
	require.NoError(t, err)
	return b
}

// start serves MCP over HTTP until the test ends or stop is called.
func (b *remoteBundle) start() { b.startWith(nil) }

// startWith is start with the configuration changed by adjust.
func (b *remoteBundle) startWith(adjust func(*mcpserver.HTTPConfig)) {
	t := b.t
	ln, err := b.http.Listen("127.0.0.1:0")
	require.NoError(t, err)
	cfg := mcpserver.HTTPConfig{
		Client:     client.Config{BaseURL: b.api.URL, Attempts: 2, Deadline: 3 * time.Second, BaseDelay: 5 * time.Millisecond},
		JournalDir: b.journalDir, Version: "test", ShutdownGrace: 2 * time.Second,
	}
	if adjust != nil {
		adjust(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mcpserver.ServeHTTP(ctx, ln, cfg) }()
	b.endpoint = "http://" + ln.Addr().String() + mcpserver.DefaultHTTPPath
	stopped := false
	var result error
	b.stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			result = <-done
		}
		return result
	}
	t.Cleanup(func() { require.NoError(t, b.stop()) })
}

// bearerTransport sends every request with token as its bearer token.
type bearerTransport struct{ token string }

func (bt bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+bt.token)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens a session with the SDK's own streamable HTTP client.
func (b *remoteBundle) connect(token string) (*mcp.ClientSession, error) {
	hc := &http.Client{}
	if token != "" {
		hc.Transport = bearerTransport{token}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "remote-agent", Version: "1"}, nil).
		Connect(b.t.Context(), &mcp.StreamableClientTransport{Endpoint: b.endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
	if err == nil {
		b.t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

func callOn(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	raw, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m), "structured content: %s", raw)
	return res, m
}

func (b *remoteBundle) notes(tenant, title string) int {
	var n int
	require.NoError(b.t, b.api.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM notes WHERE tenant = $1 AND title = $2`, tenant, title).Scan(&n))
	return n
}

func TestHTTPToolsAreListedAndCalled(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	b.start()
	cs, err := b.connect(b.api.Token)
	require.NoError(t, err)
	tools, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	require.ElementsMatch(t, []string{"create_note", "update_note", "delete_note", "get_note", "get_operation", "list_operations", "list_webhooks", "get_webhook"}, names)

	res, out := callOn(t, cs, "create_note", map[string]any{"title": "over http"})
	require.False(t, res.IsError, textOf(res))
	require.Equal(t, "completed", out["state"])
	key := out["operation_key"].(string)
	_, out = callOn(t, cs, "get_operation", map[string]any{"operation_key": key})
	require.Equal(t, "completed", out["state"])
	require.Equal(t, 1, b.notes(b.api.Tenant, "over http"))

	// The write was journalled under the token's digest.
	j, err := client.OpenFileJournal(filepath.Join(b.journalDir, mcpserver.TokenDigest(b.api.Token)))
	require.NoError(t, err)
	e, err := j.Get(t.Context(), key)
	require.NoError(t, err)
	require.NotNil(t, e.Settled)
}

// Two tenants on one server: each session writes with its caller's token
// and journals in its token's journal.
func TestHTTPTwoTenantsSeeOnlyTheirOwn(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	b.start()
	a, err := b.connect(b.api.Token)
	require.NoError(t, err)
	other, err := b.connect(b.tokenB)
	require.NoError(t, err)

	_, outA := callOn(t, a, "create_note", map[string]any{"title": "tenant a"})
	require.Equal(t, "completed", outA["state"])
	_, outB := callOn(t, other, "create_note", map[string]any{"title": "tenant b"})
	require.Equal(t, "completed", outB["state"])
	require.Equal(t, 1, b.notes(b.api.Tenant, "tenant a"))
	require.Equal(t, 0, b.notes(b.api.Tenant, "tenant b"))
	require.Equal(t, 1, b.notes(b.tenantB, "tenant b"))
	require.Equal(t, 0, b.notes(b.tenantB, "tenant a"))

	idB := outB["note"].(map[string]any)["id"].(string)
	res, _ := callOn(t, a, "get_note", map[string]any{"id": idB})
	require.True(t, res.IsError, "tenant a does not see tenant b's note")
	res, _ = callOn(t, other, "get_note", map[string]any{"id": idB})
	require.False(t, res.IsError)

	ja, err := client.OpenFileJournal(filepath.Join(b.journalDir, mcpserver.TokenDigest(b.api.Token)))
	require.NoError(t, err)
	jb, err := client.OpenFileJournal(filepath.Join(b.journalDir, mcpserver.TokenDigest(b.tokenB)))
	require.NoError(t, err)
	keyA, keyB := outA["operation_key"].(string), outB["operation_key"].(string)
	_, err = ja.Get(t.Context(), keyA)
	require.NoError(t, err)
	_, err = ja.Get(t.Context(), keyB)
	require.ErrorIs(t, err, client.ErrNotJournalled)
	_, err = jb.Get(t.Context(), keyB)
	require.NoError(t, err)
	_, err = jb.Get(t.Context(), keyA)
	require.ErrorIs(t, err, client.ErrNotJournalled)
}

// The first session of a token resumes that token's journal.
func TestHTTPResumesATokensJournal(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	ja, err := client.OpenFileJournal(filepath.Join(b.journalDir, mcpserver.TokenDigest(b.api.Token)))
	require.NoError(t, err)
	_, err = ja.Begin(t.Context(), client.JournalEntry{Key: "left-over-1", Action: contract.ActionCreateNote,
		Params: json.RawMessage(`{"title":"left over"}`), CreatedAt: time.Now().UTC()})
	require.NoError(t, err)
	b.start()
	_, err = b.connect(b.tokenB)
	require.NoError(t, err)
	_, err = b.connect(b.api.Token)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.notes(b.api.Tenant, "left over") == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 0, b.notes(b.tenantB, "left over"))
}

func initializeBody() string {
	return `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
}

func post(t *testing.T, url, authz, session string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(initializeBody()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = res.Body.Close() })
	return res
}

func TestHTTPRefusesCallersWithoutAnAcceptedToken(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	b.start()
	require.Equal(t, http.StatusUnauthorized, post(t, b.endpoint, "", "").StatusCode, "no Authorization")
	require.Equal(t, http.StatusUnauthorized, post(t, b.endpoint, "Basic Zm9vOmJhcg==", "").StatusCode, "not a bearer token")
	bogus := "qt_00000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	require.Equal(t, http.StatusUnauthorized, post(t, b.endpoint, "Bearer "+bogus, "").StatusCode, "a token the API refuses")
	_, err := os.Stat(filepath.Join(b.journalDir, mcpserver.TokenDigest(bogus)))
	require.ErrorIs(t, err, os.ErrNotExist, "a refused token gets no journal")
	_, err = b.connect("")
	require.Error(t, err, "the SDK's client without a token")

	// A session belongs to its token: another token cannot use it.
	cs, err := b.connect(b.api.Token)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, post(t, b.endpoint, "Bearer "+b.tokenB, cs.ID()).StatusCode)
	require.Equal(t, http.StatusUnauthorized, post(t, b.endpoint, "", cs.ID()).StatusCode)
	_, out := callOn(t, cs, "create_note", map[string]any{"title": "still mine"})
	require.Equal(t, "completed", out["state"])
}

// Stopping the server (SIGTERM in quill) ends it promptly with sessions
// open, after the calls in flight.
func TestHTTPShutsDownWithSessionsOpen(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	b.start()
	cs, err := b.connect(b.api.Token)
	require.NoError(t, err)
	_, out := callOn(t, cs, "create_note", map[string]any{"title": "before stop"})
	require.Equal(t, "completed", out["state"])
	start := time.Now()
	require.NoError(t, b.stop())
	require.Less(t, time.Since(start), 2*time.Second)
	_, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "get_operation", Arguments: map[string]any{"operation_key": "x"}})
	require.Error(t, err)
}
