package mcpserver_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/mcpserver"
	"github.com/quillhq/quill/internal/wait"
)

// request sends an initialize (or, with session, a request of that
// session) with the given headers from hc and returns the status, the
// headers and the body.
func request(t *testing.T, hc *http.Client, method, url string, header map[string]string) (int, http.Header, string) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(initializeBody())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := hc.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	// A successful initialize answers an event stream that stays open no
	// longer than its one event; a GET stream stays open, so only its
	// status is read.
	var b []byte
	if method == http.MethodPost || res.StatusCode != http.StatusOK {
		b, _ = io.ReadAll(res.Body)
	}
	return res.StatusCode, res.Header, string(b)
}

// jsonRPCError requires body to be a JSON-RPC error response and returns
// its message.
func jsonRPCError(t *testing.T, body string) string {
	t.Helper()
	var m struct {
		JSONRPC string `json:"jsonrpc"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &m), body)
	require.Equal(t, "2.0", m.JSONRPC, body)
	require.NotEmpty(t, m.Error.Message, body)
	return m.Error.Message
}

// A browser page of another origin cannot use the server (DNS rebinding:
// its Host names the attacker's domain too, so only the Origin tells); a
// program, which sends no Origin, and the configured origins can.
func TestHTTPRefusesForeignOrigins(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	b.startWith(func(c *mcpserver.HTTPConfig) { c.AllowedOrigins = []string{"https://agent.example.com"} })
	port := b.endpoint[strings.LastIndex(b.endpoint[:strings.LastIndex(b.endpoint, "/")], ":")+1 : strings.LastIndex(b.endpoint, "/")]
	authz := "Bearer " + b.api.Token
	hc := http.DefaultClient

	for _, origin := range []string{
		"http://evil.example:" + port, "https://evil.example", "null", "http://127.0.0.1:1", "https://agent.example.com:8443", "not an origin",
	} {
		code, _, body := request(t, hc, http.MethodPost, b.endpoint, map[string]string{"Authorization": authz, "Origin": origin})
		require.Equal(t, http.StatusForbidden, code, origin)
		require.Contains(t, jsonRPCError(t, body), "Origin", origin)
	}
	// A rebound name: Host and Origin both the attacker's.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.endpoint, strings.NewReader(initializeBody()))
	require.NoError(t, err)
	req.Host = "evil.example:" + port
	req.Header.Set("Origin", "http://evil.example:"+port)
	req.Header.Set("Authorization", authz)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	res, err := hc.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusForbidden, res.StatusCode)

	for _, origin := range []string{"", "http://127.0.0.1:" + port, "http://localhost:" + port, "https://agent.example.com", "HTTPS://Agent.Example.com:443"} {
		h := map[string]string{"Authorization": authz}
		if origin != "" {
			h["Origin"] = origin
		}
		code, _, body := request(t, hc, http.MethodPost, b.endpoint, h)
		require.Equal(t, http.StatusOK, code, "%q: %s", origin, body)
	}

	// A session's event stream (GET) is checked too.
	cs, err := b.connect(b.api.Token)
	require.NoError(t, err)
	code, _, _ := request(t, hc, http.MethodGet, b.endpoint, map[string]string{"Authorization": authz, "Mcp-Session-Id": cs.ID(), "Origin": "https://evil.example"})
	require.Equal(t, http.StatusForbidden, code)
	_, out := callOn(t, cs, "create_note", map[string]any{"title": "no origin, a program"})
	require.Equal(t, "completed", out["state"])
}

// A session that sends no request for the session timeout is closed: its
// Mcp-Session-Id answers 404 (the MCP client then opens a new session),
// while a session in use stays open.
func TestHTTPIdleSessionsEnd(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	const timeout = 300 * time.Millisecond
	b.startWith(func(c *mcpserver.HTTPConfig) { c.SessionTimeout = timeout })
	idle, err := b.connect(b.api.Token)
	require.NoError(t, err)
	busy, err := b.connect(b.api.Token)
	require.NoError(t, err)
	_, out := callOn(t, idle, "create_note", map[string]any{"title": "before idling"})
	require.Equal(t, "completed", out["state"])

	// Idle for three timeouts, while busy sends a request every third.
	until := time.Now().Add(3 * timeout)
	for time.Now().Before(until) {
		require.NoError(t, busy.Ping(t.Context(), nil))
		wait.For(t.Context(), timeout/3)
	}
	authz := "Bearer " + b.api.Token
	require.Equal(t, http.StatusNotFound, post(t, b.endpoint, authz, idle.ID()).StatusCode, "the idle session is gone")
	_, err = idle.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_operations", Arguments: map[string]any{}})
	require.Error(t, err, "the SDK's client learns that its session ended")
	_, out = callOn(t, busy, "create_note", map[string]any{"title": "still in use"})
	require.Equal(t, "completed", out["state"])
}

// fromAddress is an HTTP client whose connections come from ip, so that the
// server sees another RemoteAddr than 127.0.0.1's.
func fromAddress(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// randomToken is a token of the API's form that no one made.
func randomToken(t *testing.T) string {
	t.Helper()
	raw := make([]byte, 36)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	return "qt_" + hex.EncodeToString(raw[:4]) + "_" + base64.RawURLEncoding.EncodeToString(raw[4:])
}

// Bogus bearer strings from one caller cost the API's failed-authentication
// budget of this server's address next to nothing: malformed ones and
// repeats never reach it, and new well-formed ones are rationed per
// caller's address, so the API never rate-limits the server and another
// caller's new token still opens a session.
func TestHTTPBogusTokensDoNotSpendTheAPIsBudget(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	fresh, err := auth.Create(context.Background(), b.api.Pool, b.tenantB, time.Now())
	require.NoError(t, err)
	var reached, limited atomic.Int64
	b.api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := r.Header.Get("Authorization")
			if h != "Bearer "+b.api.Token && h != "Bearer "+fresh {
				reached.Add(1)
			}
			rec := &statusRecorder{ResponseWriter: w}
			next.ServeHTTP(rec, r)
			if rec.status == http.StatusTooManyRequests {
				limited.Add(1)
			}
		})
	})
	b.start()
	attacker := fromAddress(t, "127.0.0.2")

	var refused []string
	rateLimited := 0
	for range 60 {
		tok := randomToken(t)
		code, h, body := request(t, attacker, http.MethodPost, b.endpoint, map[string]string{"Authorization": "Bearer " + tok})
		switch code {
		case http.StatusUnauthorized:
			refused = append(refused, tok)
		case http.StatusTooManyRequests:
			rateLimited++
			s, err := strconv.Atoi(h.Get("Retry-After"))
			require.NoError(t, err, "Retry-After %q", h.Get("Retry-After"))
			require.Positive(t, s)
			jsonRPCError(t, body)
		default:
			t.Fatalf("a bogus token got %d: %s", code, body)
		}
	}
	require.Zero(t, limited.Load(), "the API rate-limited the MCP server's address")
	require.Equal(t, mcpserver.DefaultAddressFailureBurst, len(refused), "the address's burst is checked with the API")
	require.Equal(t, 60-mcpserver.DefaultAddressFailureBurst, rateLimited)
	for i := range 100 {
		code, _, _ := request(t, attacker, http.MethodPost, b.endpoint, map[string]string{"Authorization": fmt.Sprintf("Bearer garbage-%d", i)})
		require.Equal(t, http.StatusUnauthorized, code, "a malformed token is refused here")
	}
	for range 20 {
		code, _, _ := request(t, attacker, http.MethodPost, b.endpoint, map[string]string{"Authorization": "Bearer " + refused[0]})
		require.Equal(t, http.StatusUnauthorized, code, "a refused token is remembered")
	}
	require.LessOrEqual(t, reached.Load(), int64(mcpserver.DefaultAddressFailureBurst), "bogus tokens that reached the API")

	// Another caller's token, new to the server and to the API, opens a
	// session and writes.
	cs, err := b.connect(fresh)
	require.NoError(t, err)
	_, out := callOn(t, cs, "create_note", map[string]any{"title": "beside the attack"})
	require.Equal(t, "completed", out["state"])
	require.Equal(t, 1, b.notes(b.tenantB, "beside the attack"))
	require.Zero(t, limited.Load(), "the API never rate-limited the MCP server's address")
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// rawConn dials the server from ip (127.0.0.1 when empty).
func (b *remoteBundle) rawConn(t *testing.T, ip string) net.Conn {
	t.Helper()
	d := net.Dialer{}
	if ip != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(ip)}
	}
	u, err := url.Parse(b.endpoint)
	require.NoError(t, err)
	c, err := d.DialContext(t.Context(), "tcp", u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedWithin reports whether the server closed c within d: a read ends
// in EOF (after whatever the server still sent) rather than the deadline.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// unauthorized sends a request without a token on c and reads its 401,
// leaving c an idle keep-alive connection.
func unauthorized(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	_, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", mcpserver.DefaultHTTPPath, c.RemoteAddr())
	require.NoError(t, err)
	res, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
}

// SPEC §2's timeouts hold on the MCP server's connections: a body that
// never comes is given up after the read timeout, an idle keep-alive is
// closed after the idle timeout, and headers past 64 KiB are refused.
func TestHTTPTimeoutsAndHeaderLimit(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	b.http = httpserve.Settings{ReadTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}
	b.start()

	silent := b.rawConn(t, "")
	_, err := fmt.Fprintf(silent, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{",
		mcpserver.DefaultHTTPPath, b.api.Token)
	require.NoError(t, err)
	require.True(t, closedWithin(silent, 5*time.Second), "a body that never comes ends its connection")

	idle := b.rawConn(t, "")
	unauthorized(t, idle, bufio.NewReader(idle))
	require.True(t, closedWithin(idle, 5*time.Second), "an idle keep-alive connection is closed")

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.endpoint, strings.NewReader(initializeBody()))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.api.Token)
	req.Header.Set("X-Padding", strings.Repeat("a", 70<<10))
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, res.StatusCode)
}

// One address's idle connections hold no more than its share of the
// connection cap: its own idle ones make room for its new ones, and
// another caller is served at once.
func TestHTTPOneAddressHoldsItsShareOfConnections(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	// A share of 4: an MCP client holds an event stream and sends its
	// calls beside it, on connections of their own.
	b.http = httpserve.Settings{MaxConnections: 16}
	b.start()
	var conns []net.Conn
	for range 16 {
		c := b.rawConn(t, "127.0.0.2")
		unauthorized(t, c, bufio.NewReader(c))
		conns = append(conns, c)
	}
	require.Eventually(t, func() bool {
		closed := 0
		for _, c := range conns {
			if closedWithin(c, 20*time.Millisecond) {
				closed++
			}
		}
		return closed >= 16-b.http.AddressShare()
	}, 5*time.Second, 50*time.Millisecond, "the address keeps at most its share open")

	start := time.Now()
	cs, err := b.connect(b.api.Token)
	require.NoError(t, err)
	_, out := callOn(t, cs, "create_note", map[string]any{"title": "another address"})
	require.Equal(t, "completed", out["state"])
	require.Less(t, time.Since(start), 3*time.Second)
}

// The write timeout bounds each write, not a whole response: a tool call
// that takes longer than it still gets its answer.
func TestHTTPWriteTimeoutBoundsEachWrite(t *testing.T) {
	t.Parallel()
	b := setupRemote(t)
	const timeout = 300 * time.Millisecond
	b.http = httpserve.Settings{WriteTimeout: timeout}
	b.start()
	cs, err := b.connect(b.api.Token)
	require.NoError(t, err)
	arrived, release := b.api.HoldFirstCreate(t)
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_note", Arguments: map[string]any{"title": "slower than the write timeout"}})
		done <- answer{res, err}
	}()
	<-arrived
	wait.For(t.Context(), 3*timeout) // the call outlasts the write timeout
	close(release)
	a := <-done
	require.NoError(t, a.err)
	require.False(t, a.res.IsError, textOf(a.res))
	require.Equal(t, 1, b.notes(b.api.Tenant, "slower than the write timeout"))
}
