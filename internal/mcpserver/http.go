package mcpserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/wait"
)

// Defaults of HTTPConfig.
const (
	// DefaultHTTPPath is where the MCP endpoint is served.
	DefaultHTTPPath = "/mcp"
	// DefaultShutdownGrace bounds the wait for the tool calls in flight
	// when the server stops.
	DefaultShutdownGrace = 10 * time.Second
	// DefaultSessionTimeout is how long a session may go without a
	// request before it is closed and its Mcp-Session-Id answers 404;
	// the MCP client then opens a new one.
	DefaultSessionTimeout = 30 * time.Minute
	// tokenCheckKey is the operation key whose lookup checks a new
	// caller's token: any answer after authentication (404 or 200) means
	// the API knows the token.
	tokenCheckKey = "quill-mcp-token-check"
)

// HTTPConfig configures ServeHTTP.
type HTTPConfig struct {
	// Client is the template of every caller's client: its Token is the
	// caller's bearer token and its Journal the caller's journal; any
	// Token or Journal set here is ignored (a server-side token would
	// lend one tenant's rights to every caller). BaseURL is required.
	Client client.Config
	// JournalDir holds one journal per caller's token, in the directory
	// JournalDir/TokenDigest(token). Required.
	JournalDir string
	// Version is the implementation version announced. Default "dev".
	Version string
	// Log receives the server's and the resumes' lines. Default: none.
	Log zerolog.Logger
	// Path is the MCP endpoint's path. Default DefaultHTTPPath.
	Path string
	// ShutdownGrace bounds the wait for calls in flight once ctx ends.
	// Default DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// PruneInterval is how often each token's journal is pruned, from its
	// first session on (Config.PruneInterval). Default DefaultPruneInterval.
	PruneInterval time.Duration
	// AllowedOrigins are the origins (scheme://host[:port]) whose browser
	// pages may call the server, besides its own (see ServeHTTP). Default
	// none.
	AllowedOrigins []string
	// SessionTimeout closes a session that had no request for this long.
	// Default DefaultSessionTimeout.
	SessionTimeout time.Duration
	// AuthLimits bound what callers' bearer tokens cost the API. Zero
	// fields take their defaults.
	AuthLimits AuthLimits
	// TrustedProxies are the proxies in front of the server
	// (httpserve.Settings.TrustedProxies): from them, a caller's address
	// for AuthLimits is the last X-Forwarded-For hop that is not one.
	TrustedProxies httpserve.TrustedProxies
}

// TokenDigest names a token's journal directory: the first 128 bits of
// its SHA-256, in hex. The server never learns the tenant without a call,
// and a digest keeps the token itself off the disk and out of paths.
func TokenDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:16])
}

// ServeHTTP serves the tools over MCP's streamable HTTP transport on ln
// until ctx ends, then shuts down gracefully: it stops taking requests,
// waits up to ShutdownGrace for tool calls in flight, closes the sessions
// and stops the start-up resumes (what they did not finish stays unsettled
// in the journals, for the next start). Each session's bearer token is its
// caller's Authorization header; a request without one, or with one that
// is not of the API's form, is answered 401, a new session with a token
// the API refuses 401, and a request of a session with another token 403.
//
// Against hostile callers (decision 0067): a request with an Origin header
// other than the server's own — http://ADDR of ln's address, and for a
// loopback address http://localhost:PORT, http://127.0.0.1:PORT and
// http://[::1]:PORT — or one of AllowedOrigins is answered 403 (requests
// without Origin, from programs rather than browser pages, pass); a
// session without a request for SessionTimeout is closed; a token the API
// refused is refused without asking it again for AuthLimits.NegativeTTL,
// and the checks of new tokens are rationed per client address and in
// all (429 with Retry-After past them), below the API's own budget.
//
// It returns an error for a bad configuration or when serving fails; nil
// after a shutdown.
//
// The connections are ln's (httpserve: SPEC §2's read and idle timeouts, a
// header limit, the connection cap where an idle connection makes room and
// each address's share). Its write timeout bounds each write of a response
// rather than the whole response: the deadline is set anew before every
// write and flush, so an event stream or a long tool call lives as long as
// its reader takes what it is sent, and a reader that stops is cut off
// within the timeout (decision 0067).
func ServeHTTP(ctx context.Context, ln *httpserve.Listener, cfg HTTPConfig) error {
	if cfg.JournalDir == "" {
		return errors.New("mcp http: JournalDir is required")
	}
	cfg.Client.Token, cfg.Client.Journal = "", nil
	probe := cfg.Client
	probe.Token = "x" // the template is checked as a caller's client would be
	if _, err := client.New(probe); err != nil {
		return fmt.Errorf("mcp http: %w", err)
	}
	if cfg.Path == "" {
		cfg.Path = DefaultHTTPPath
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	allowed, err := newOrigins(ln.Addr(), cfg.AllowedOrigins)
	if err != nil {
		return fmt.Errorf("mcp http: %w", err)
	}
	resumeCtx, stopResumes := context.WithCancel(context.WithoutCancel(ctx))
	defer stopResumes()
	rs := &remote{cfg: cfg, resumeCtx: resumeCtx, tenants: map[string]*Server{}, gate: newGate(cfg.AuthLimits)}

	sdk := mcp.NewStreamableHTTPHandler(rs.server, &mcp.StreamableHTTPOptions{SessionTimeout: cfg.SessionTimeout})
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if !tokenForm.MatchString(token) {
			return nil, fmt.Errorf("%w: not a Quill token", auth.ErrInvalidToken)
		}
		// The session is bound to the token's digest: the SDK answers
		// 403 to a request of the session under another token.
		return &auth.TokenInfo{UserID: TokenDigest(token)}, nil
	}
	authed := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
	mux := http.NewServeMux()
	var perWrite time.Duration
	mux.Handle(cfg.Path, rs.count(allowed.check(authed(rs.admit(sdk)))))
	srv := ln.Server(writeDeadlines(&perWrite, mux))
	perWrite = srv.WriteTimeout
	srv.BaseContext = func(net.Listener) context.Context { return context.WithoutCancel(ctx) }

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	cfg.Log.Info().Str("addr", ln.Addr().String()).Str("path", cfg.Path).Msg("serving MCP over streamable HTTP")
	var serveErr error
	select {
	case serveErr = <-served:
	case <-ctx.Done():
	}

	// Stop taking connections, let the calls in flight finish (their
	// results reach the callers), then end the sessions, which ends
	// their open event streams, so that Shutdown does not wait for them.
	shut := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace+time.Second)
		defer cancel()
		shut <- srv.Shutdown(sctx)
	}()
	deadline := time.Now().Add(cfg.ShutdownGrace)
	for rs.calls.Load() > 0 && time.Now().Before(deadline) {
		wait.For(context.Background(), 10*time.Millisecond)
	}
	rs.closeSessions()
	if err := <-shut; err != nil {
		_ = srv.Close()
	}
	stopResumes()
	rs.resumes.Wait()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("mcp http: %w", serveErr)
	}
	cfg.Log.Info().Msg("MCP over HTTP stopped")
	return nil
}

// remote is the state of ServeHTTP: one Server (client, journal) per
// token.
type remote struct {
	cfg       HTTPConfig
	resumeCtx context.Context
	resumes   sync.WaitGroup
	calls     atomic.Int64 // requests other than event streams (GET) in flight

	gate *gate

	mu      sync.Mutex
	tenants map[string]*Server // by TokenDigest
}

// count tracks the requests that carry calls, for the shutdown's wait.
func (rs *remote) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			rs.calls.Add(1)
			defer rs.calls.Add(-1)
		}
		next.ServeHTTP(w, r)
	})
}

// admit makes sure that a request opening a session (one without
// Mcp-Session-Id) comes with a token the API accepts, and sets up that
// token's Server the first time: its client, its journal and its resume.
// A refused token gets no journal directory. A token accepted before in
// this process costs the API nothing; one it refused within the negative
// TTL is refused at once; any other is checked with the API only within
// the budgets of the caller's address and of the server.
func (rs *remote) admit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
			next.ServeHTTP(w, r)
			return
		}
		token := bearer(r)
		if rs.known(token) {
			next.ServeHTTP(w, r)
			return
		}
		unknownToken := func() {
			w.Header().Set("WWW-Authenticate", "Bearer")
			refuse(w, http.StatusUnauthorized, "the Quill API does not accept this bearer token")
		}
		if rs.gate.refused(token) {
			unknownToken()
			return
		}
		hold, wait := rs.gate.admit(clientAddress(r, rs.cfg.TrustedProxies))
		if hold == nil {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)))
			refuse(w, http.StatusTooManyRequests, "too many bearer tokens the Quill API refused, from this address or in all; retry after "+wait.String())
			return
		}
		_, err := rs.tenant(r.Context(), token)
		var p *client.Problem
		switch {
		case err == nil:
			hold.release()
		case errors.As(err, &p) && p.Status == http.StatusUnauthorized:
			rs.gate.remember(token)
			unknownToken()
			return
		case errors.As(err, &p) && p.Status == http.StatusTooManyRequests:
			hold.release()
			retry := max(time.Second, p.RetryAfter.Round(time.Second))
			w.Header().Set("Retry-After", strconv.Itoa(int(retry/time.Second)))
			refuse(w, http.StatusTooManyRequests, "the Quill API is rate-limiting this server; retry after "+retry.String())
			return
		default:
			hold.release()
			rs.cfg.Log.Warn().Err(err).Msg("cannot open a session")
			w.Header().Set("Retry-After", "5")
			refuse(w, http.StatusServiceUnavailable, "cannot open a session: "+err.Error())
			return
		}
		next.ServeHTTP(w, r)
	})
}

// known reports whether token's Server is set up: the API accepted it.
func (rs *remote) known(token string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.tenants[TokenDigest(token)] != nil
}

// bearer returns the request's bearer token (RequireBearerToken has
// checked that there is one).
func bearer(r *http.Request) string {
	var scheme, token string
	_, _ = fmt.Sscan(r.Header.Get("Authorization"), &scheme, &token)
	return token
}

// server is the SDK's getServer: the Server of the request's token, set up
// by admit.
func (rs *remote) server(r *http.Request) *mcp.Server {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if s := rs.tenants[TokenDigest(bearer(r))]; s != nil {
		return s.MCP()
	}
	return nil // answered 400 by the SDK; admit makes it unreachable
}

// tenant returns token's Server, creating it after checking the token
// with the API: one client, one journal and one resume per token and
// process.
func (rs *remote) tenant(ctx context.Context, token string) (*Server, error) {
	digest := TokenDigest(token)
	rs.mu.Lock()
	s := rs.tenants[digest]
	rs.mu.Unlock()
	if s != nil {
		return s, nil
	}
	cfg := rs.cfg.Client
	cfg.Token = token
	c, err := client.New(cfg)
	if err != nil {
		return nil, err
	}
	_, err = c.GetOperation(ctx, tokenCheckKey)
	var p *client.Problem
	if err != nil && !(errors.As(err, &p) && p.Code == contract.CodeOpNotFound) {
		return nil, fmt.Errorf("check the token with the API: %w", err)
	}
	j, err := client.OpenFileJournal(filepath.Join(rs.cfg.JournalDir, digest))
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	cfg.Journal = j
	if c, err = client.New(cfg); err != nil {
		return nil, err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if s := rs.tenants[digest]; s != nil { // set up meanwhile by another request
		return s, nil
	}
	log := rs.cfg.Log.With().Str("journal", j.Dir()).Logger()
	s = New(c, Config{Version: rs.cfg.Version, Log: log, PruneInterval: rs.cfg.PruneInterval})
	rs.tenants[digest] = s
	rs.resumes.Go(func() { s.Resume(rs.resumeCtx) })
	rs.resumes.Go(func() { s.KeepPruned(rs.resumeCtx) })
	return s, nil
}

// closeSessions ends every session of every token.
func (rs *remote) closeSessions() {
	rs.mu.Lock()
	servers := make([]*Server, 0, len(rs.tenants))
	for _, s := range rs.tenants {
		servers = append(servers, s)
	}
	rs.mu.Unlock()
	for _, s := range servers {
		for ss := range s.MCP().Sessions() {
			_ = ss.Close()
		}
	}
}

// writeDeadlines sets the connection's write deadline to *timeout from now
// before every write and flush of a response (and at its start), in place
// of the server's one deadline for the whole response.
func writeDeadlines(timeout *time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: *timeout}
		dw.extend()
		next.ServeHTTP(dw, r)
	})
}

// deadlineWriter is a ResponseWriter whose every write must end within
// timeout.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (d *deadlineWriter) extend() {
	if d.timeout > 0 {
		_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	}
}

// Write implements http.ResponseWriter.
func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.extend()
	return d.ResponseWriter.Write(p)
}

// FlushError flushes the response (http.ResponseController calls it).
func (d *deadlineWriter) FlushError() error {
	d.extend()
	return d.rc.Flush()
}

// Flush implements http.Flusher.
func (d *deadlineWriter) Flush() { _ = d.FlushError() }

// Unwrap gives http.ResponseController the underlying writer.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
