package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
)

// Cookie names. Over TLS (directly or behind a trusted proxy) the session
// cookie has the __Host- prefix, which a browser keeps only when it is
// Secure, for the whole host (Path=/) and without a Domain, so that no
// other site or plain-HTTP page can set or shadow it; over plain HTTP it
// keeps the console's own path.
const (
	sessionCookie       = "quill_console"
	secureSessionCookie = "__Host-quill_console"
)

// session is what the signed session cookie holds.
type session struct {
	// ID names the session in console_signouts once it is signed out.
	ID      string `json:"i"`
	Prefix  string `json:"p"`
	Name    string `json:"n"`
	Expires int64  `json:"e"`
}

var sessionIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

type ctxKey struct{}

func sessionOf(r *http.Request) (session, bool) {
	s, ok := r.Context().Value(ctxKey{}).(session)
	return s, ok
}

// Signed-out sessions (migration 00012), kept until they would have
// expired; each sign-out removes those past it.
const (
	sqlSignout = `WITH gone AS (DELETE FROM console_signouts WHERE expires_at < $3)
		INSERT INTO console_signouts (session_id, expires_at) VALUES ($1, $2) ON CONFLICT (session_id) DO NOTHING`
	sqlSignedOut = `SELECT EXISTS (SELECT 1 FROM console_signouts WHERE session_id = $1)`
)

// maxCookie bounds a session cookie's value: a longer one is no session
// and costs no work.
const maxCookie = 1024

// encodeSession returns the cookie value for s signed with key id:
// "<key id>.<base64url JSON>.<base64url HMAC>".
func encodeSession(id int32, key []byte, s session) string {
	body, _ := json.Marshal(s)
	kid := strconv.FormatInt(int64(id), 10)
	b := base64.RawURLEncoding.EncodeToString(body)
	return kid + "." + b + "." + base64.RawURLEncoding.EncodeToString(mac(key, "session", kid, b))
}

// splitSession returns a cookie value's key id, body and MAC, unchecked.
func splitSession(v string) (id int32, kid, body string, sig []byte, ok bool) {
	if len(v) > maxCookie {
		return 0, "", "", nil, false
	}
	kid, rest, ok1 := strings.Cut(v, ".")
	body, sigText, ok2 := strings.Cut(rest, ".")
	n, err := strconv.ParseInt(kid, 10, 32)
	if !ok1 || !ok2 || err != nil || n <= 0 || kid != strconv.FormatInt(n, 10) {
		return 0, "", "", nil, false
	}
	sig, err = base64.RawURLEncoding.DecodeString(sigText)
	if err != nil {
		return 0, "", "", nil, false
	}
	return int32(n), kid, body, sig, true
}

// decodeSession checks a cookie value's MAC under key and its expiry: not
// past, and no further off than a session lasts.
func decodeSession(key []byte, kid, body string, sig []byte, now time.Time, ttl time.Duration) (session, bool) {
	if !hmac.Equal(sig, mac(key, "session", kid, body)) {
		return session{}, false
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return session{}, false
	}
	var s session
	if json.Unmarshal(raw, &s) != nil || s.Prefix == "" || !sessionIDRE.MatchString(s.ID) ||
		now.Unix() >= s.Expires || s.Expires > now.Add(ttl).Unix()+1 {
		return session{}, false
	}
	return s, true
}

// cookieName is the session cookie's name for r.
func (c *Console) cookieName(r *http.Request) string {
	if c.cfg.TrustedProxies.Secure(r) {
		return secureSessionCookie
	}
	return sessionCookie
}

// sessionCookieFor returns the session cookie for r with value and
// expiry (a negative maxAge deletes it).
func (c *Console) sessionCookieFor(r *http.Request, value string, expires time.Time, maxAge int) *http.Cookie {
	ck := &http.Cookie{Name: sessionCookie, Value: value, Path: Prefix, Expires: expires, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode}
	if c.cfg.TrustedProxies.Secure(r) {
		ck.Name, ck.Path, ck.Secure = secureSessionCookie, "/", true
	}
	return ck
}

// signedIn runs h for a request with a valid session, and sends anyone else
// to the sign-in page (a GET) or refuses them (403 for anything else).
func (c *Console) signedIn(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok, err := c.session(r)
		if err != nil {
			c.failErr(w, r, "check the session", err)
			return
		}
		if !ok {
			if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, ".json") {
				http.Redirect(w, r, Prefix+"signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			c.fail(w, r, http.StatusForbidden, "Sign in first.")
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s)))
	}
}

// session returns the request's session when its cookie is signed with a
// key that may still verify it, it has not expired or been signed out,
// and its operator token is still valid.
func (c *Console) session(r *http.Request) (session, bool, error) {
	ck, err := r.Cookie(c.cookieName(r))
	if err != nil {
		return session{}, false, nil
	}
	id, kid, body, sig, ok := splitSession(ck.Value)
	if !ok {
		return session{}, false, nil
	}
	ks, err := c.keys(r.Context(), id)
	if err != nil {
		return session{}, false, err
	}
	now := c.cfg.Now()
	key, ok := c.verifier(ks, id, now)
	if !ok {
		return session{}, false, nil
	}
	s, ok := decodeSession(key, kid, body, sig, now, c.cfg.SessionTTL)
	if !ok {
		return session{}, false, nil
	}
	ok, err = c.sessionValid(r.Context(), s)
	return s, ok, err
}

// sessionValid reports whether s is not signed out and its operator token
// is valid, asking the database at most once per ValidityTTL.
func (c *Console) sessionValid(ctx context.Context, s session) (bool, error) {
	now := c.cfg.Now()
	c.validMu.Lock()
	until, ok := c.valid[s.ID]
	c.validMu.Unlock()
	if ok && now.Before(until) {
		return true, nil
	}
	var out bool
	if err := c.pool.QueryRow(ctx, sqlSignedOut, s.ID).Scan(&out); err != nil {
		return false, fmt.Errorf("check the console session: %w", db.Translate(err))
	}
	valid := !out
	if valid {
		var err error
		if valid, err = auth.OperatorValid(ctx, c.pool, s.Prefix); err != nil {
			return false, err
		}
	}
	c.validMu.Lock()
	defer c.validMu.Unlock()
	if !valid {
		delete(c.valid, s.ID)
		return false, nil
	}
	c.trust(s.ID, now)
	return true, nil
}

// trust remembers session id as valid for ValidityTTL from now. Callers
// hold c.validMu.
func (c *Console) trust(id string, now time.Time) {
	if len(c.valid) > 10000 { // operators' sessions are few; bound it anyway
		clear(c.valid)
	}
	c.valid[id] = now.Add(c.cfg.ValidityTTL)
}

// action bounds a POST's form before h runs. Cross-origin POSTs never get
// here: http.CrossOriginProtection refuses them in ServeHTTP.
func (c *Console) action(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		h(w, r)
	}
}

// crossOrigin answers a POST that http.CrossOriginProtection refused.
func (c *Console) crossOrigin(w http.ResponseWriter, r *http.Request) {
	c.log.Warn().Str("path", r.URL.Path).Str("error_category", "console_cross_origin").
		Msg("console request refused: sent from another origin")
	c.fail(w, r, http.StatusForbidden, "This request was refused: it was sent from another site or origin, not from this console's own pages. Open the console and try again.")
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	if _, ok, _ := c.session(r); ok {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	c.showSignin(w, r, http.StatusOK, "")
}

func (c *Console) showSignin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "signin", page{Title: "Sign in", Message: msg,
		Data: map[string]string{"Next": safeNext(r.FormValue("next"))}})
}

// safeNext keeps a post-sign-in destination inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix
	}
	return next
}

// signin checks an operator token. Each failed attempt costs the client
// address's budget; while it is spent, the answer is 429 with Retry-After
// and no token is looked up.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	now := c.cfg.Now()
	addr := c.cfg.TrustedProxies.ClientAddr(r)
	giveBack, err := c.signins.Take(addr, now)
	var limited *auth.RateLimitedError
	if errors.As(err, &limited) {
		secs := int64(limited.RetryAfter / time.Second)
		c.log.Warn().Str("client_addr", addr).Str("error_category", "console_rate_limited").
			Msg("console sign-in refused: too many failed sign-ins from this address")
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		c.showSignin(w, r, http.StatusTooManyRequests, fmt.Sprintf("Too many failed sign-ins from this address. Try again in %d seconds.", secs))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	op, err := auth.AuthenticateOperator(ctx, c.pool, r.PostFormValue("token"))
	switch {
	case errors.Is(err, auth.ErrTenantToken):
		c.log.Warn().Str("client_addr", addr).Str("error_category", "console_tenant_token").Msg("console sign-in refused: a tenant token")
		c.showSignin(w, r, http.StatusUnauthorized, "A tenant token cannot sign in to the console. Use an operator token (made with \"api token create --operator\").")
		return
	case errors.Is(err, auth.ErrUnauthenticated):
		c.log.Warn().Str("client_addr", addr).Str("error_category", "console_unauthenticated").Msg("console sign-in refused: not a valid operator token")
		c.showSignin(w, r, http.StatusUnauthorized, "This is not a valid operator token (it may have been revoked).")
		return
	case err != nil:
		giveBack() // the database's failure, not the client's
		c.failErr(w, r, "sign in", err)
		return
	}
	giveBack()
	ks, err := c.keys(ctx, 0)
	if err != nil {
		c.failErr(w, r, "sign in", err)
		return
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	s := session{ID: hex.EncodeToString(raw[:]), Prefix: op.Prefix, Name: op.Name, Expires: now.Add(c.cfg.SessionTTL).Unix()}
	newest := ks[len(ks)-1]
	http.SetCookie(w, c.sessionCookieFor(r, encodeSession(newest.id, newest.secret, s), time.Unix(s.Expires, 0), 0))
	c.validMu.Lock()
	c.trust(s.ID, now)
	c.validMu.Unlock()
	c.actionLog(s, "signin").Int32("session_key", newest.id).Msg("console: operator signed in")
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

// signout ends the session for good: it is recorded as signed out until it
// would have expired, so its cookie, replayed, is refused — at once by this
// process, within ValidityTTL by another API's.
func (c *Console) signout(w http.ResponseWriter, r *http.Request) {
	s, _ := sessionOf(r)
	now := c.cfg.Now()
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	if _, err := c.pool.Exec(ctx, sqlSignout, s.ID, time.Unix(s.Expires, 0), now); err != nil {
		c.failErr(w, r, "sign out", fmt.Errorf("record the sign-out: %w", db.Translate(err)))
		return
	}
	c.validMu.Lock()
	delete(c.valid, s.ID)
	c.validMu.Unlock()
	http.SetCookie(w, c.sessionCookieFor(r, "", time.Time{}, -1))
	c.actionLog(s, "signout").Msg("console: operator signed out")
	http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
}

func isUnavailable(err error) bool { return errors.Is(err, db.ErrUnavailable) }
