package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
)

// Cookie names. The session cookie is scoped to the console's path; the
// sign-in cookie only carries the sign-in form's CSRF nonce.
const (
	sessionCookie = "quill_console"
	signinCookie  = "quill_console_signin"
)

// session is what the signed session cookie holds.
type session struct {
	Prefix  string `json:"p"`
	Name    string `json:"n"`
	Expires int64  `json:"e"`
	// raw is the cookie's value, the CSRF token's input.
	raw string
}

type ctxKey struct{}

func sessionOf(r *http.Request) (session, bool) {
	s, ok := r.Context().Value(ctxKey{}).(session)
	return s, ok
}

// sqlSessionKey derives the session key from the database's id secret
// (migration 00009) under a label of its own, so that sessions survive a
// restart and hold across the API's instances without a setting, and the
// key is never the secret that makes note ids.
const sqlSessionKey = `SELECT secret FROM id_secret`

// sessionKey returns the key that signs sessions and CSRF tokens, read
// once. Errors: database errors.
func (c *Console) sessionKey(ctx context.Context) ([]byte, error) {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	if c.key != nil {
		return c.key, nil
	}
	var secret []byte
	if err := c.pool.QueryRow(ctx, sqlSessionKey).Scan(&secret); err != nil {
		return nil, fmt.Errorf("read the session key: %w", db.Translate(err))
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("quill console session v1"))
	c.key = m.Sum(nil)
	return c.key, nil
}

func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// encodeSession returns the cookie value for s: its JSON and its MAC.
func encodeSession(key []byte, s session) string {
	body, _ := json.Marshal(s)
	b := base64.RawURLEncoding.EncodeToString(body)
	return b + "." + base64.RawURLEncoding.EncodeToString(mac(key, "session", b))
}

// decodeSession checks a cookie value's MAC and expiry.
func decodeSession(key []byte, v string, now time.Time) (session, bool) {
	b, sig, ok := strings.Cut(v, ".")
	if !ok || len(v) > 1024 {
		return session{}, false
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac(key, "session", b)) {
		return session{}, false
	}
	body, err := base64.RawURLEncoding.DecodeString(b)
	if err != nil {
		return session{}, false
	}
	var s session
	if json.Unmarshal(body, &s) != nil || now.Unix() >= s.Expires || s.Prefix == "" {
		return session{}, false
	}
	s.raw = v
	return s, true
}

// csrfToken is the CSRF token of a session: a MAC of its cookie, so it
// changes with every sign-in and cannot be made without the key.
func (c *Console) csrfToken(s session) string {
	return hex.EncodeToString(mac(c.key, "csrf", s.raw)[:16])
}

// signinToken is the CSRF token of the sign-in form, bound to the nonce in
// the sign-in cookie (login CSRF: nobody else can sign a browser in as
// them).
func signinToken(key []byte, nonce string) string {
	return hex.EncodeToString(mac(key, "signin", nonce)[:16])
}

func secure(r *http.Request) bool { return r.TLS != nil }

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

// session returns the request's session when its cookie is valid and its
// operator token still is.
func (c *Console) session(r *http.Request) (session, bool, error) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false, nil
	}
	key, err := c.sessionKey(r.Context())
	if err != nil {
		return session{}, false, err
	}
	s, ok := decodeSession(key, ck.Value, c.cfg.Now())
	if !ok {
		return session{}, false, nil
	}
	ok, err = c.tokenValid(r.Context(), s.Prefix)
	return s, ok, err
}

// tokenValid reports whether the operator token with prefix is valid,
// asking the database at most once per ValidityTTL.
func (c *Console) tokenValid(ctx context.Context, prefix string) (bool, error) {
	now := c.cfg.Now()
	c.validMu.Lock()
	until, ok := c.valid[prefix]
	c.validMu.Unlock()
	if ok && now.Before(until) {
		return true, nil
	}
	valid, err := auth.OperatorValid(ctx, c.pool, prefix)
	if err != nil {
		return false, err
	}
	c.validMu.Lock()
	defer c.validMu.Unlock()
	if !valid {
		delete(c.valid, prefix)
		return false, nil
	}
	if len(c.valid) > 10000 { // operators' tokens are few; bound it anyway
		clear(c.valid)
	}
	c.valid[prefix] = now.Add(c.cfg.ValidityTTL)
	return true, nil
}

// action checks a POST's CSRF token (and, when the browser sends them, its
// Origin and Sec-Fetch-Site) before h runs.
func (c *Console) action(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, _ := sessionOf(r)
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(c.csrfToken(s))) != 1 {
			c.log.Warn().Str("operator", s.Name).Str("token_prefix", s.Prefix).Str("path", r.URL.Path).
				Str("error_category", "console_csrf").Msg("console action refused: missing or wrong CSRF token")
			c.fail(w, r, http.StatusForbidden, "This action was refused: its form is not from this console (missing or wrong CSRF token). Reload the page and try again.")
			return
		}
		h(w, r)
	}
}

// sameOrigin is false when the browser says the request comes from another
// site. Browsers that send neither header are judged by the CSRF token
// alone.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	if _, ok, _ := c.session(r); ok {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	c.showSignin(w, r, http.StatusOK, "")
}

func (c *Console) showSignin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	key, err := c.sessionKey(r.Context())
	if err != nil {
		c.failErr(w, r, "show the sign-in page", err)
		return
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	nonce := hex.EncodeToString(raw[:])
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: nonce, Path: Prefix, MaxAge: 3600,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	c.render(w, r, status, "signin", page{Title: "Sign in", Message: msg,
		Data: map[string]string{"CSRF": signinToken(key, nonce), "Next": safeNext(r.FormValue("next"))}})
}

// safeNext keeps a post-sign-in destination inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix
	}
	return next
}

func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	key, err := c.sessionKey(r.Context())
	if err != nil {
		c.failErr(w, r, "sign in", err)
		return
	}
	ck, cerr := r.Cookie(signinCookie)
	if cerr != nil || !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(signinToken(key, ck.Value))) != 1 {
		c.log.Warn().Str("error_category", "console_csrf").Msg("console sign-in refused: missing or wrong CSRF token")
		c.showSignin(w, r, http.StatusForbidden, "The sign-in form was not from this console, or it expired. Try again.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	op, err := auth.AuthenticateOperator(ctx, c.pool, r.PostFormValue("token"))
	switch {
	case errors.Is(err, auth.ErrTenantToken):
		c.log.Warn().Str("error_category", "console_tenant_token").Msg("console sign-in refused: a tenant token")
		c.showSignin(w, r, http.StatusUnauthorized, "A tenant token cannot sign in to the console. Use an operator token (made with \"api token create --operator\").")
		return
	case errors.Is(err, auth.ErrUnauthenticated):
		c.log.Warn().Str("error_category", "console_unauthenticated").Msg("console sign-in refused: not a valid operator token")
		c.showSignin(w, r, http.StatusUnauthorized, "This is not a valid operator token (it may have been revoked).")
		return
	case err != nil:
		c.failErr(w, r, "sign in", err)
		return
	}
	s := session{Prefix: op.Prefix, Name: op.Name, Expires: c.cfg.Now().Add(c.cfg.SessionTTL).Unix()}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: encodeSession(key, s), Path: Prefix,
		Expires: time.Unix(s.Expires, 0), HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	c.validMu.Lock()
	c.valid[op.Prefix] = c.cfg.Now().Add(c.cfg.ValidityTTL)
	c.validMu.Unlock()
	c.actionLog(s, "signin").Msg("console: operator signed in")
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request) {
	s, _ := sessionOf(r)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	c.actionLog(s, "signout").Msg("console: operator signed out")
	http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
}

func isUnavailable(err error) bool { return errors.Is(err, db.ErrUnavailable) }
