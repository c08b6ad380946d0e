package console_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/console"
	"github.com/quillhq/quill/internal/httpserve"
)

// signInRaw posts a sign-in with tok through c, with extra headers, and
// returns the answer (its body read).
func signInRaw(t *testing.T, c *http.Client, base, tok string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/console/signin", strings.NewReader(url.Values{"token": {tok}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, ck := range resp.Cookies() {
		if ck.Name == name {
			return ck
		}
	}
	return nil
}

// getWith sends a GET to u with the cookie ck and headers hdr, and returns
// its status.
func getWith(t *testing.T, c *http.Client, u string, ck *http.Cookie, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	if ck != nil {
		req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func noRedirects(c *http.Client) *http.Client {
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

func loopback(t *testing.T) console.TrustedProxies {
	t.Helper()
	ps, err := httpserve.ParsePrefixes("127.0.0.0/8, ::1")
	require.NoError(t, err)
	return ps
}

// requireHostCookie checks that ck is the __Host- session cookie as a
// browser keeps it: Secure, Path=/, no Domain.
func requireHostCookie(t *testing.T, ck *http.Cookie) {
	t.Helper()
	require.NotNil(t, ck, "a __Host-quill_console cookie is set")
	require.True(t, ck.Secure)
	require.Equal(t, "/", ck.Path)
	require.Empty(t, ck.Domain)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
}

// TestSecureCookieOverTLS: reached over TLS, the session cookie is Secure
// and named with the __Host- prefix, and it is the one the console reads.
func TestSecureCookieOverTLS(t *testing.T) {
	t.Parallel()
	h := startWith(t, options{tls: true})
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := noRedirects(h.srv.Client())
	c.Jar = jar
	resp := signInRaw(t, c, h.srv.URL, h.opToken, nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	requireHostCookie(t, cookieNamed(resp, "__Host-quill_console"))
	require.Nil(t, cookieNamed(resp, "quill_console"))
	code, _, _ := get(t, c, h.srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code, "the __Host- cookie is the session")

	// Signing out deletes the same cookie.
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/console/signout", nil)
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	gone := cookieNamed(resp, "__Host-quill_console")
	require.NotNil(t, gone)
	require.Less(t, gone.MaxAge, 0)
	require.Equal(t, "/", gone.Path)
	require.True(t, gone.Secure)
}

// TestSecureCookieBehindTrustedProxy: behind a declared proxy that says
// https the cookie is the __Host- one; the same header from a peer that is
// not declared changes nothing; and a plain cookie is no session on a
// request that arrived over TLS.
func TestSecureCookieBehindTrustedProxy(t *testing.T) {
	t.Parallel()
	behind := startWith(t, options{cfg: console.Config{TrustedProxies: loopback(t)}})
	c := noRedirects(&http.Client{})
	https := map[string]string{"X-Forwarded-Proto": "https"}

	resp := signInRaw(t, c, behind.srv.URL, behind.opToken, https)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	ck := cookieNamed(resp, "__Host-quill_console")
	requireHostCookie(t, ck)
	require.Equal(t, http.StatusOK, getWith(t, c, behind.srv.URL+"/console/", ck, https))
	require.Equal(t, http.StatusSeeOther, getWith(t, c, behind.srv.URL+"/console/", ck, nil),
		"without the proxy's https the request is plain, and its cookie is quill_console")
	plain := &http.Cookie{Name: "quill_console", Value: ck.Value}
	require.Equal(t, http.StatusSeeOther, getWith(t, c, behind.srv.URL+"/console/", plain, https),
		"over TLS only the __Host- cookie is read")
	// The nearest proxy's value is the last one.
	require.Equal(t, http.StatusSeeOther, getWith(t, c, behind.srv.URL+"/console/", ck, map[string]string{"X-Forwarded-Proto": "https, http"}))

	// Over plain HTTP behind the proxy the cookie stays the plain one.
	resp = signInRaw(t, c, behind.srv.URL, behind.opToken, map[string]string{"X-Forwarded-Proto": "http"})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Nil(t, cookieNamed(resp, "__Host-quill_console"))
	require.False(t, cookieNamed(resp, "quill_console").Secure)

	// A peer not declared: its X-Forwarded-Proto is not believed.
	undeclared, err := httpserve.ParsePrefixes("10.0.0.0/8")
	require.NoError(t, err)
	for name, ps := range map[string]console.TrustedProxies{"no proxies": nil, "another network": undeclared} {
		h := startWith(t, options{cfg: console.Config{TrustedProxies: ps}})
		resp := signInRaw(t, c, h.srv.URL, h.opToken, https)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, name)
		require.Nil(t, cookieNamed(resp, "__Host-quill_console"), name)
		ck := cookieNamed(resp, "quill_console")
		require.NotNil(t, ck, name)
		require.False(t, ck.Secure, name)
		require.Equal(t, "/console/", ck.Path, name)
	}
}

// countingLookups counts the operator-token lookups a pool runs.
type countingLookups struct{ n atomic.Int64 }

func (c *countingLookups) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "FROM operator_tokens WHERE prefix = $1 AND revoked_at IS NULL") {
		c.n.Add(1)
	}
	return ctx
}
func (c *countingLookups) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// fromAddr is a client whose connections come from the loopback address
// ip (Linux answers on all of 127.0.0.0/8).
func fromAddr(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return noRedirects(&http.Client{Transport: tr})
}

// TestSigninThrottledPerAddress: past its burst of failed sign-ins an
// address is answered 429 with Retry-After, and not even a valid token is
// looked up; another address still signs in. The address is the peer's,
// or a declared proxy's X-Forwarded-For, never an undeclared peer's.
func TestSigninThrottledPerAddress(t *testing.T) {
	t.Parallel()
	const burst = 3
	bad := "qo_00000000_" + strings.Repeat("A", 43)

	// exhaust makes burst failed sign-ins with send, then checks the
	// refusal that follows.
	exhaust := func(t *testing.T, h *harness, lookups *countingLookups, send func(tok string) *http.Response) {
		t.Helper()
		for range burst {
			require.Equal(t, http.StatusUnauthorized, send(bad).StatusCode)
		}
		before := lookups.n.Load()
		resp := send(h.opToken)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "even a valid token, past the budget")
		secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After is seconds")
		require.Equal(t, 10, secs, "one failure's worth: DefaultSigninFailureRefill")
		require.Nil(t, cookieNamed(resp, "quill_console"))
		require.Equal(t, before, lookups.n.Load(), "no token lookup past the budget")
		require.Contains(t, h.logs.String(), `"error_category":"console_rate_limited"`)
	}
	setup := func(t *testing.T, ps console.TrustedProxies) (*harness, *countingLookups) {
		t.Helper()
		h := startWith(t, options{})
		lookups := &countingLookups{}
		cfg := h.api.Pool.Config().Copy()
		cfg.ConnConfig.Tracer = lookups
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		con := h.newConsole(t, options{pool: pool, cfg: console.Config{TrustedProxies: ps, SigninFailureBurst: burst}})
		h.srv = httptest.NewServer(con.Mount(http.NotFoundHandler()))
		t.Cleanup(h.srv.Close)
		return h, lookups
	}

	t.Run("peer address", func(t *testing.T) {
		t.Parallel()
		h, lookups := setup(t, nil)
		a, b := fromAddr(t, "127.0.0.2"), fromAddr(t, "127.0.0.3")
		n := 0
		exhaust(t, h, lookups, func(tok string) *http.Response {
			n++ // a new X-Forwarded-For each time: an undeclared peer's is not believed
			return signInRaw(t, a, h.srv.URL, tok, map[string]string{"X-Forwarded-For": "198.51.100." + strconv.Itoa(n)})
		})
		require.Equal(t, http.StatusSeeOther, signInRaw(t, b, h.srv.URL, h.opToken, nil).StatusCode, "another address signs in")
		h.advance(console.DefaultSigninFailureRefill)
		require.Equal(t, http.StatusSeeOther, signInRaw(t, a, h.srv.URL, h.opToken, nil).StatusCode, "the budget refills")
	})
	t.Run("behind a declared proxy", func(t *testing.T) {
		t.Parallel()
		h, lookups := setup(t, loopback(t))
		c := noRedirects(&http.Client{})
		exhaust(t, h, lookups, func(tok string) *http.Response {
			// What the client wrote left of the proxy's entry is its own
			// to invent and changes nothing.
			return signInRaw(t, c, h.srv.URL, tok, map[string]string{"X-Forwarded-For": "192.0.2." + strconv.Itoa(int(time.Now().UnixNano()%250)) + ", 203.0.113.7"})
		})
		resp := signInRaw(t, c, h.srv.URL, h.opToken, map[string]string{"X-Forwarded-For": "203.0.113.8"})
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "another client behind the same proxy signs in")
	})
}

// TestCrossOriginPostsRefused: http.CrossOriginProtection refuses a POST
// that a browser says comes from another origin — by Sec-Fetch-Site, or
// without it by an Origin that is not this host, "null" included (a
// sandboxed frame) — for an action and for the sign-in (login CSRF), and
// changes nothing; the console's own POSTs need no more than their origin.
func TestCrossOriginPostsRefused(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	ctx := t.Context()
	var id string
	require.NoError(t, h.api.Pool.QueryRow(ctx, `INSERT INTO outbox_events (id, tenant, aggregate_id, type, payload, created_at, parked_at, parked_reason, attempts)
		VALUES (gen_random_uuid(), 'acme', gen_random_uuid(), 'note.created', '{}', now(), now(), 'too large', 1) RETURNING id::text`).Scan(&id))
	parked := func() bool {
		var p bool
		require.NoError(t, h.api.Pool.QueryRow(ctx, `SELECT parked_at IS NOT NULL FROM outbox_events WHERE id = $1`, id).Scan(&p))
		return p
	}
	send := func(path string, form url.Values, hdr map[string]string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	host := strings.TrimPrefix(h.srv.URL, "http://")
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site", "Origin": "http://" + host}, // another port or subdomain of the site
		{"Origin": "null"},
		{"Origin": "http://evil.example"},
		{"Origin": "http://" + strings.Replace(host, "127.0.0.1", "localhost", 1)},
	} {
		require.Equal(t, http.StatusForbidden, send("/console/parked/retry", url.Values{"id": {id}}, hdr), "%v", hdr)
		require.True(t, parked(), "%v: nothing refused changed anything", hdr)
		fresh := browser(t)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/console/signin", strings.NewReader(url.Values{"token": {h.opToken}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := fresh.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "sign-in %v", hdr)
		require.Nil(t, cookieNamed(resp, "quill_console"), "no session from another origin")
	}
	require.Contains(t, h.logs.String(), `"error_category":"console_cross_origin"`)

	// The console's own form: same-origin, as a browser says it.
	require.Equal(t, http.StatusSeeOther, send("/console/parked/retry", url.Values{"id": {id}},
		map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://" + host}))
	require.False(t, parked())
}

// cookieKey returns the key id a session cookie names.
func cookieKey(t *testing.T, ck *http.Cookie) int32 {
	t.Helper()
	kid, _, ok := strings.Cut(ck.Value, ".")
	require.True(t, ok)
	n, err := strconv.ParseInt(kid, 10, 32)
	require.NoError(t, err)
	return int32(n)
}

// signInCookie signs a new browser in and returns it with its cookie.
func (h *harness) signInCookie(t *testing.T) (*http.Client, *http.Cookie) {
	t.Helper()
	c := browser(t)
	resp := signInRaw(t, c, h.srv.URL, h.opToken, nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	ck := cookieNamed(resp, "quill_console")
	require.NotNil(t, ck)
	return c, ck
}

// TestSessionKeyRotation: after "api console rotate-key" new sessions are
// signed with the new key, sessions signed with the previous one still
// work until they expire, and --end-sessions ends them all; a cookie that
// claims to last longer than a session does is refused.
func TestSessionKeyRotation(t *testing.T) {
	t.Parallel()
	h := start(t)
	ctx := t.Context()
	old, oldCookie := h.signInCookie(t)
	first := cookieKey(t, oldCookie)

	rot, err := console.RotateSessionKey(ctx, h.api.Pool, *h.now.Load(), false)
	require.NoError(t, err)
	require.Greater(t, rot.ID, first)
	require.Zero(t, rot.Dropped, "the previous key still has sessions")
	// The console reads the keys again within ValidityTTL.
	h.advance(11 * time.Second)
	code, _, _ := get(t, old, h.srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code, "a session of the previous key still works")
	fresh, freshCookie := h.signInCookie(t)
	require.Equal(t, rot.ID, cookieKey(t, freshCookie), "a new session is signed with the new key")
	code, _, _ = get(t, fresh, h.srv.URL+"/console/")
	require.Equal(t, http.StatusOK, code)

	// Another API process, reading the keys for the first time, takes both.
	other := httptest.NewServer(h.newConsole(t, options{}).Mount(http.NotFoundHandler()))
	t.Cleanup(other.Close)
	for _, ck := range []*http.Cookie{oldCookie, freshCookie} {
		require.Equal(t, http.StatusOK, getWith(t, noRedirects(&http.Client{}), other.URL+"/console/", ck, nil))
	}

	// A cookie signed with a real key but claiming a longer life than a
	// session has is refused.
	var secret []byte
	require.NoError(t, h.api.Pool.QueryRow(ctx, `SELECT secret FROM console_session_keys WHERE id = $1`, rot.ID).Scan(&secret))
	parts := strings.Split(freshCookie.Value, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var body map[string]any
	require.NoError(t, json.Unmarshal(raw, &body))
	body["e"] = h.now.Load().Add(365 * 24 * time.Hour).Unix()
	raw, err = json.Marshal(body)
	require.NoError(t, err)
	b := base64.RawURLEncoding.EncodeToString(raw)
	m := hmac.New(sha256.New, secret)
	for _, p := range []string{"session", parts[0], b} {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	long := &http.Cookie{Name: "quill_console", Value: parts[0] + "." + b + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))}
	require.Equal(t, http.StatusSeeOther, getWith(t, noRedirects(&http.Client{}), h.srv.URL+"/console/", long, nil))
	// (The same cookie with the real expiry passes: the forgery is right.)
	body["e"] = h.now.Load().Add(time.Hour).Unix()
	raw, _ = json.Marshal(body)
	b = base64.RawURLEncoding.EncodeToString(raw)
	m = hmac.New(sha256.New, secret)
	for _, p := range []string{"session", parts[0], b} {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	ok := &http.Cookie{Name: "quill_console", Value: parts[0] + "." + b + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))}
	require.Equal(t, http.StatusOK, getWith(t, noRedirects(&http.Client{}), h.srv.URL+"/console/", ok, nil))

	// Past a session's life the previous key verifies nothing, and the
	// next rotation drops it.
	h.advance(console.DefaultSessionTTL + 30*time.Second)
	rot2, err := console.RotateSessionKey(ctx, h.api.Pool, *h.now.Load(), false)
	require.NoError(t, err)
	require.EqualValues(t, 1, rot2.Dropped, "the first key verifies no session any more")

	// --end-sessions: every older key goes, and with it every session.
	_, ck := h.signInCookie(t)
	h.advance(11 * time.Second)
	require.Equal(t, http.StatusOK, getWith(t, noRedirects(&http.Client{}), h.srv.URL+"/console/", ck, nil))
	end, err := console.RotateSessionKey(ctx, h.api.Pool, *h.now.Load(), true)
	require.NoError(t, err)
	require.EqualValues(t, 2, end.Dropped)
	h.advance(11 * time.Second)
	require.Equal(t, http.StatusSeeOther, getWith(t, noRedirects(&http.Client{}), h.srv.URL+"/console/", ck, nil))
	_, ck = h.signInCookie(t)
	require.Equal(t, end.ID, cookieKey(t, ck))
}

// TestSignoutEndsTheSession: a session's cookie replayed after its
// sign-out is refused, by this API process and by another.
func TestSignoutEndsTheSession(t *testing.T) {
	t.Parallel()
	h := start(t)
	other := httptest.NewServer(h.newConsole(t, options{}).Mount(http.NotFoundHandler()))
	t.Cleanup(other.Close)
	c, ck := h.signInCookie(t)
	_, kept := h.signInCookie(t) // another session of the same operator
	replay := noRedirects(&http.Client{})
	require.Equal(t, http.StatusOK, getWith(t, replay, h.srv.URL+"/console/", ck, nil))

	code, _, hdr := post(t, c, h.srv.URL+"/console/signout", nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/console/signin", hdr.Get("Location"))
	require.Contains(t, h.logs.String(), `"console_action":"signout"`)

	require.Equal(t, http.StatusSeeOther, getWith(t, replay, h.srv.URL+"/console/", ck, nil), "replayed on the same process")
	require.Equal(t, http.StatusSeeOther, getWith(t, replay, other.URL+"/console/", ck, nil), "replayed on another process")
	require.Equal(t, http.StatusOK, getWith(t, replay, h.srv.URL+"/console/", kept, nil), "the operator's other session goes on")
	code, _, _ = get(t, c, h.srv.URL+"/console/overview.json")
	require.Equal(t, http.StatusForbidden, code)
}

// TestTrustedProxies: the setting's syntax, and which address and scheme a
// request is taken to have from which peer.
func TestTrustedProxies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "", want: nil},
		{in: " 10.0.0.0/8 , 192.0.2.7,::1, 2001:db8::/32 ", want: []string{"10.0.0.0/8", "192.0.2.7/32", "::1/128", "2001:db8::/32"}},
		{in: "10.1.2.3/8", want: []string{"10.0.0.0/8"}},
		{in: "::ffff:192.0.2.1", want: []string{"192.0.2.1/32"}},
		{in: "10.0.0.0/8,proxy.internal", err: `"proxy.internal" is neither an IP address nor a CIDR prefix`},
		{in: "10.0.0.0/33", err: `"10.0.0.0/33"`},
	} {
		ps, err := httpserve.ParsePrefixes(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		var got []string
		for _, p := range ps {
			got = append(got, p.String())
		}
		require.Equal(t, tc.want, got, tc.in)
	}

	ps := console.TrustedProxies{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name, peer, xff, xfp string
		addr                 string
		secure               bool
	}{
		{name: "direct", peer: "192.0.2.1:5000", addr: "192.0.2.1"},
		{name: "undeclared peer's headers ignored", peer: "192.0.2.1:5000", xff: "203.0.113.9", xfp: "https", addr: "192.0.2.1"},
		{name: "proxy without headers", peer: "10.0.0.5:5000", addr: "10.0.0.5"},
		{name: "proxy", peer: "10.0.0.5:5000", xff: "203.0.113.9", xfp: "https", addr: "203.0.113.9", secure: true},
		{name: "client's own entries ignored", peer: "10.0.0.5:5000", xff: "1.2.3.4, 203.0.113.9", addr: "203.0.113.9"},
		{name: "chain of proxies", peer: "10.0.0.5:5000", xff: "203.0.113.9, 10.9.9.9", xfp: "HTTPS", addr: "203.0.113.9", secure: true},
		{name: "with a port", peer: "10.0.0.5:5000", xff: "203.0.113.9:4711", addr: "203.0.113.9"},
		{name: "malformed last entry", peer: "10.0.0.5:5000", xff: "203.0.113.9, garbage", addr: "10.0.0.5"},
		{name: "all proxies", peer: "10.0.0.5:5000", xff: "10.1.1.1", addr: "10.1.1.1"},
		{name: "nearest proxy says http", peer: "10.0.0.5:5000", xfp: "https,http", addr: "10.0.0.5"},
		{name: "IPv4-mapped peer", peer: "[::ffff:10.0.0.5]:5000", xff: "203.0.113.9", xfp: "https", addr: "203.0.113.9", secure: true},
	} {
		r := httptest.NewRequest(http.MethodGet, "/console/", nil)
		r.RemoteAddr = tc.peer
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if tc.xfp != "" {
			r.Header.Set("X-Forwarded-Proto", tc.xfp)
		}
		require.Equal(t, tc.addr, ps.ClientAddr(r), tc.name)
		require.Equal(t, tc.secure, ps.Secure(r), tc.name)
	}
}

// TestDeadLetterConsumerNameEscaped: a consumer's name is text the pages
// escape wherever they show it — taken from ?consumer= or from the table
// (a DeadLetterWriter chooses it) — in the page, in its links and in the
// overview; the name of no consumer lists none; the retry's POST is
// refused from another origin before anything else is asked.
func TestDeadLetterConsumerNameEscaped(t *testing.T) {
	t.Parallel()
	h := start(t)
	c := browser(t)
	_, _ = h.signIn(t, c, h.opToken)
	ctx := t.Context()
	const evil = `"><script>alert(1)</script>`
	var id int64
	require.NoError(t, h.api.Pool.QueryRow(ctx, `INSERT INTO quill_consumer_dead_letters (consumer, event_id, event_type, stream_seq, subject, payload, headers, reason, deliveries, created_at)
		VALUES ($1, 'e', '', 7, 's', '', '{}', 'boom', 5, now()) RETURNING id`, evil).Scan(&id))
	escaped := url.Values{"consumer": {evil}, "id": {strconv.FormatInt(id, 10)}}

	for _, path := range []string{"/console/dead-letters", "/console/dead-letters?consumer=" + url.QueryEscape(evil),
		"/console/dead-letters/retry?" + escaped.Encode(), "/console/"} {
		code, body, _ := get(t, c, h.srv.URL+path)
		require.Equal(t, http.StatusOK, code, path)
		require.NotContains(t, body, "<script>alert", path)
		require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;", path)
	}
	code, body, _ := get(t, c, h.srv.URL+"/console/dead-letters")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `href="/console/dead-letters?consumer=%22%3e%3cscript%3ealert%281%29%3c%2fscript%3e"`, "query-escaped in a link")
	code, body, _ = get(t, c, h.srv.URL+"/console/dead-letters?consumer="+url.QueryEscape("<b>nobody</b>"))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No dead letters of this consumer")
	require.NotContains(t, body, "<b>nobody")

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/console/dead-letters/retry", strings.NewReader(escaped.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "refused before the console looks for NATS")
	code, _, _ = post(t, c, h.srv.URL+"/console/dead-letters/retry", escaped)
	require.Equal(t, http.StatusServiceUnavailable, code, "from the console itself: past the origin check (no NATS here)")
}
