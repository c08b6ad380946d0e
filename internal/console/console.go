// Package console is the operator console (SPEC §8): web pages, served by
// the API process on its admin address under /console/, that answer an
// operator's questions on one screen — what became of an operation (its
// request, commit, events, stream and consumer), how the pipeline is doing,
// and what is stuck — and retry what is stuck.
//
// The pages are rendered on the server with html/template; one small
// script, served from the binary, draws the overview's charts. Nothing is
// loaded from elsewhere and no inline script runs (the Content-Security-Policy
// forbids it).
//
// Security (decisions 0062, 0068): the console is served only when the
// operator turns it on (QUILL_CONSOLE). An operator signs in with an
// operator token (qo_…; a tenant token is refused); failed sign-ins cost
// the client address's budget (auth.AddressBudget), past which sign-in is
// refused with 429 before any lookup. The session is a cookie (HttpOnly,
// SameSite=Strict; over TLS, directly or behind a trusted proxy, Secure and
// named __Host-) signed with the newest of the console's own session keys
// (RotateSessionKey), naming the token's prefix; it is trusted for
// Config.ValidityTTL at a time before the database is asked again whether
// it was signed out or its token revoked. Signing out records the session
// as ended. Every action is a POST, refused when it comes from another
// origin (http.CrossOriginProtection), and logged with the operator's name.
//
// The data is the audit's (internal/audit): a lookup is a key audit, and the
// chain it shows is the audit's chain, anomalies included — one source, not
// a second implementation. Retries go through the code paths of the CLI
// commands (outbox.Unpark for "relay events retry", consumer.Store.Redrive for
// "attachment-worker dead-letters retry"); the dead-letter pages show and
// retry every consumer's, each named by its consumer and id. The Webhooks
// page lists the webhook dispatcher's disabled endpoints and failed
// deliveries and re-sends and enables them through internal/dispatch's
// operator functions, those of "webhook-dispatcher deliveries retry" and
// "endpoints enable".
package console

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/auth"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Defaults of Config.
const (
	DefaultSessionTTL  = 12 * time.Hour
	DefaultValidityTTL = 30 * time.Second
	DefaultPageSize    = 50
	// DefaultSigninFailureBurst and DefaultSigninFailureRefill are each
	// client address's budget of failed sign-ins: 10 at once, then one per
	// 10 seconds.
	DefaultSigninFailureBurst  = 10
	DefaultSigninFailureRefill = 10 * time.Second
	// MaxPageSize bounds ?limit= on the list pages.
	MaxPageSize = 500
	// queryTimeout bounds the database work of one page.
	queryTimeout = 10 * time.Second
)

// Config is the console's settings; zero fields take their defaults.
type Config struct {
	// SessionTTL is how long a sign-in lasts. Default 12h.
	SessionTTL time.Duration
	// ValidityTTL is how long a session trusts that its operator token is
	// not revoked before it asks the database again. Default 30s.
	ValidityTTL time.Duration
	// PageSize is the rows of a list page. Default 50.
	PageSize int
	// TrustedProxies are the peers whose X-Forwarded-Proto and
	// X-Forwarded-For are believed (QUILL_TRUSTED_PROXIES). Default none.
	TrustedProxies TrustedProxies
	// SigninFailureBurst is how many failed sign-ins an address may make
	// at once. Default 10.
	SigninFailureBurst int
	// SigninFailureRefill is how long an address waits for one more
	// failed sign-in once its burst is spent. Default 10s.
	SigninFailureRefill time.Duration
	// Audit holds the horizons, stream and consumer the lookups use (as
	// "api audit" would be given them).
	Audit audit.Config
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	c.SessionTTL = cmp.Or(c.SessionTTL, DefaultSessionTTL)
	c.ValidityTTL = cmp.Or(c.ValidityTTL, DefaultValidityTTL)
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.SigninFailureBurst = cmp.Or(c.SigninFailureBurst, DefaultSigninFailureBurst)
	c.SigninFailureRefill = cmp.Or(c.SigninFailureRefill, DefaultSigninFailureRefill)
	c.Audit = c.Audit.WithDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Audit.Now = c.Now
	return c
}

// Deps is what the console needs.
type Deps struct {
	Pool *pgxpool.Pool
	// JetStream returns the API's JetStream context, or nil while NATS is
	// not connected: lookups then leave the stream unchecked, and dead
	// letters cannot be retried. Nil: no NATS at all.
	JetStream func() jetstream.JetStream
	Log       zerolog.Logger
	Config    Config
}

// Console serves the console's pages; see the package comment.
type Console struct {
	pool *pgxpool.Pool
	// store is the consumer package's tables: the dead letters of every
	// consumer, each under its durable name.
	store *consumer.Store
	js    func() jetstream.JetStream
	log   zerolog.Logger
	cfg   Config
	pages map[string]*template.Template
	// handler is the mux behind http.CrossOriginProtection.
	handler http.Handler

	keyMu    sync.Mutex
	keyring  []sessionKey // the session keys, oldest first, read on first use
	keysRead time.Time

	validMu sync.Mutex
	valid   map[string]time.Time // session id → trusted until

	signins *auth.AddressBudget // failed sign-ins per client address

	samples *sampler
}

// Prefix is where the console is mounted.
const Prefix = "/console/"

// New returns the console. Errors: a template that does not parse (a
// build defect).
func New(d Deps) (*Console, error) {
	cfg := d.Config.withDefaults()
	c := &Console{pool: d.Pool, js: d.JetStream, log: d.Log, cfg: cfg,
		valid: map[string]time.Time{}, samples: newSampler(360),
		signins: auth.NewAddressBudget(float64(time.Second)/float64(cfg.SigninFailureRefill), cfg.SigninFailureBurst)}
	if c.js == nil {
		c.js = func() jetstream.JetStream { return nil }
	}
	var err error
	if c.store, err = consumer.NewStore(d.Pool, ""); err != nil {
		return nil, err
	}
	if err := c.parse(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("console static files: %w", err)
	}
	m := http.NewServeMux()
	m.Handle("GET /console/static/", http.StripPrefix("/console/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /console/{$}", c.signedIn(c.overview))
	m.HandleFunc("GET /console/signin", c.signinPage)
	m.HandleFunc("POST /console/signin", c.signin)
	m.HandleFunc("POST /console/signout", c.signedIn(c.action(c.signout)))
	m.HandleFunc("GET /console/lookup", c.signedIn(c.lookup))
	m.HandleFunc("GET /console/thumbnail", c.signedIn(c.thumbnail))
	m.HandleFunc("GET /console/overview.json", c.signedIn(c.overviewJSON))
	m.HandleFunc("GET /console/parked", c.signedIn(c.parkedList))
	m.HandleFunc("GET /console/parked/retry", c.signedIn(c.parkedConfirm))
	m.HandleFunc("POST /console/parked/retry", c.signedIn(c.action(c.parkedRetry)))
	m.HandleFunc("GET /console/dead-letters", c.signedIn(c.deadList))
	m.HandleFunc("GET /console/dead-letters/retry", c.signedIn(c.deadConfirm))
	m.HandleFunc("POST /console/dead-letters/retry", c.signedIn(c.action(c.deadRetry)))
	m.HandleFunc("GET /console/webhooks", c.signedIn(c.webhooks))
	for _, a := range c.webhookActions() {
		m.HandleFunc("GET "+Prefix+a.path, c.signedIn(func(w http.ResponseWriter, r *http.Request) { a.confirm(c, w, r) }))
		m.HandleFunc("POST "+Prefix+a.path, c.signedIn(c.action(func(w http.ResponseWriter, r *http.Request) { a.post(c, w, r) })))
	}
	m.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "There is no such page.")
	})
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(c.crossOrigin))
	c.handler = cop.Handler(m)
	return c, nil
}

// ServeHTTP serves the console under Prefix, with its security headers on
// every answer.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// Lookups carry tenants and keys in their URLs: no Referer leaks them
	// to another origin. (Not no-referrer: under it a browser sends
	// "Origin: null" with the console's own forms, which
	// CrossOriginProtection must refuse where no Sec-Fetch-Site comes
	// along, as over plain HTTP to a host other than localhost.)
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	c.handler.ServeHTTP(w, r)
}

// Mount returns a handler that serves the console under Prefix and
// everything else with next (the admin endpoints).
func (c *Console) Mount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/console" {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		if strings.HasPrefix(r.URL.Path, Prefix) {
			c.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// parse parses every page with the layout.
func (c *Console) parse() error {
	funcs := template.FuncMap{
		"ago":   func(t *time.Time) string { return ago(c.cfg.Now(), t) },
		"since": func(s *string) string { return since(c.cfg.Now(), s) },
		"yes":   func(p *bool) bool { return p != nil && *p },
		// when is a time a page shows, or "—" for none.
		"when": func(t *time.Time) string {
			if t == nil {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"deref": func(p *int64) int64 {
			if p == nil {
				return 0
			}
			return *p
		},
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return fmt.Errorf("console templates: %w", err)
	}
	c.pages = map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return fmt.Errorf("console template %s: %w", n, err)
		}
		c.pages[base] = t
	}
	return nil
}

// page is what every page's template gets beside its own data.
type page struct {
	Title    string
	Operator string
	Nav      string
	Data     any
	// Message is a line shown above the content (an action's outcome).
	Message string
}

// render writes the page named name with status.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t, ok := c.pages[name]
	if !ok {
		c.log.Error().Str("page", name).Msg("console page missing")
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	if s, ok := sessionOf(r); ok {
		p.Operator = s.Name
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := t.Execute(w, p); err != nil {
		c.log.Warn().Err(err).Str("page", name).Msg("console page not written whole")
	}
}

// actionLog starts the log line of an operator's action: who did it, under
// which token, and what.
func (c *Console) actionLog(s session, action string) *zerolog.Event {
	return c.log.Info().Str("operator", s.Name).Str("token_prefix", s.Prefix).Str("console_action", action)
}

// fail answers a plain page with status and one line for the operator.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", page{Title: http.StatusText(status), Data: msg})
}

// failErr answers a database or NATS failure: 503 when a dependency is
// unreachable or slow, 500 otherwise; the error itself goes to the log.
func (c *Console) failErr(w http.ResponseWriter, r *http.Request, what string, err error) {
	status := http.StatusInternalServerError
	msg := "Could not " + what + "; the error is in the API's log."
	if errors.Is(err, context.DeadlineExceeded) || isUnavailable(err) {
		status = http.StatusServiceUnavailable
		msg = "Could not " + what + ": the database did not answer in time. Try again."
	}
	c.log.Error().Err(err).Str("console", what).Str("error_category", "console_failed").Msg("console request failed")
	c.fail(w, r, status, msg)
}

func ago(now time.Time, t *time.Time) string {
	if t == nil {
		return "—"
	}
	d := now.Sub(*t).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

func since(now time.Time, s *string) string {
	if s == nil {
		return "—"
	}
	t, err := time.Parse(audit.TimeFormat, *s)
	if err != nil {
		return *s
	}
	return ago(now, &t)
}
