// Package httpapi is Quill's HTTP API (SPEC §3): routing, authentication,
// strict JSON input, problem+json errors and the mapping of domain errors to
// status codes, all in one place.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/api"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/problem"
	"github.com/quillhq/quill/internal/webhooks"

	"github.com/quillhq/quill/internal/validation"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytes       = 2 << 20
	DefaultMaxAttachmentBytes = 1 << 20
	DefaultMaxListBytes       = 1 << 20
)

// Config holds the API's request limits.
type Config struct {
	// MaxBodyBytes bounds a request body; more is 413. Default 2 MiB.
	MaxBodyBytes int64
	// MaxAttachmentBytes bounds a decoded attachment; more is 413.
	// Default 1 MiB.
	MaxAttachmentBytes int
	// MaxConcurrency is the most requests the API works on at once;
	// past it a request is answered 429 rate_limited before its body is
	// read. Default 256.
	MaxConcurrency int
	// TenantConcurrency is the most authenticated requests of one tenant
	// the API works on at once; past it 429, before the body is read.
	// Default 32.
	TenantConcurrency int
	// TenantRate is the most requests per second of one tenant, a token
	// bucket of TenantBurst (default: one second's worth, at least 1);
	// past it 429, before the body is read. 0: no rate limit (the
	// default).
	TenantRate  float64
	TenantBurst int
	// MaxListBytes bounds the items of a list page, encoded: a page ends
	// early, with a next_cursor, before the item that would pass it (a
	// page holds at least one item). Default 1 MiB.
	MaxListBytes int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxAttachmentBytes == 0 {
		c.MaxAttachmentBytes = DefaultMaxAttachmentBytes
	}
	if c.MaxConcurrency <= 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	if c.TenantConcurrency <= 0 {
		c.TenantConcurrency = DefaultTenantConcurrency
	}
	if c.MaxListBytes <= 0 {
		c.MaxListBytes = DefaultMaxListBytes
	}
	return c
}

// Metrics receives per-request counts and durations.
type Metrics interface {
	// HTTPRequest records one answered request: its route pattern (or
	// "unmatched"), method, status and the time from its arrival to the
	// end of its response.
	HTTPRequest(route, method string, code int, d time.Duration)
}

// Deps are what the API needs.
type Deps struct {
	Pool *pgxpool.Pool
	// Auth checks tokens; nil means an uncached authenticator over Pool.
	Auth  *auth.Authenticator
	Notes *notes.Service
	// Webhooks serves the webhook endpoints; nil, or one without a key,
	// answers their routes 503 webhooks_not_configured.
	Webhooks *webhooks.Service
	Log      zerolog.Logger
	Metrics  Metrics
	Config   Config
	// Tracer makes a span for each request (tracing.Provider.Tracer);
	// nil is tracing off.
	Tracer trace.Tracer
}

type server struct {
	Deps
	admit *admission
	// routed is every method some route serves (HEAD wherever GET is):
	// the method label's values besides methodOther.
	routed map[string]bool
}

// methodOther is the method label of a request whose method no route
// serves (SPEC §8), as OpenTelemetry names such a method: the raw method
// is the caller's invention, and a label or log value made of it would be
// a series, and memory, that any caller mints.
const methodOther = "_OTHER"

// methodLabel is r's method as metrics, spans and log lines name it: a
// method some route serves, or methodOther.
func (s *server) methodLabel(r *http.Request) string {
	if s.routed[r.Method] {
		return r.Method
	}
	return methodOther
}

// NewServer returns the API's handler.
func NewServer(d Deps) http.Handler {
	d.Config = d.Config.WithDefaults()
	if d.Auth == nil {
		d.Auth = auth.NewAuthenticator(d.Pool, 0)
	}
	s := &server{Deps: d, admit: newAdmission(d.Config.MaxConcurrency, d.Config.TenantConcurrency, d.Config.TenantRate, d.Config.TenantBurst),
		routed: map[string]bool{}}
	mux := http.NewServeMux()
	var operations http.Handler
	for _, rt := range s.routes() {
		for m := range rt.methods {
			s.routed[m] = true
		}
		if rt.methods[http.MethodGet] != nil {
			s.routed[http.MethodHead] = true
		}
		// MaxConcurrency's slot is taken after the tenant's: a request
		// its tenant's limit refuses takes none, so that one tenant
		// flooding past its limit cannot fill the server's slots and turn
		// other tenants away (decision 0040). Both are taken before the
		// handler reads the body. The token check before them costs a
		// query only for a token not cached, and those are bounded per
		// client address (decision 0042).
		h := s.admitServer(rt.methods)
		if !rt.public {
			h = s.authed(s.admitTenant(h))
		}
		if rt.pattern == operationsPattern {
			operations = h // routed on the raw path, below
			continue
		}
		mux.Handle(rt.pattern, h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, problem.New(http.StatusNotFound, contract.CodeNotFound, "no such resource"))
	})
	return s.observe(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/") {
			// "*" (or anything else the mux would answer with a bare
			// 400): no resource of the API, answered as a problem.
			writeProblem(w, r, problem.New(http.StatusNotFound, contract.CodeNotFound, "no such resource"))
			return
		}
		// Operation keys may be "." or ".." or hold "/" (any of 0x21–0x7E
		// but '"' and ','), which the mux would clean or split: they are
		// routed on the raw path, before it.
		if key, ok := strings.CutPrefix(r.URL.EscapedPath(), operationsPrefix); ok {
			k, err := url.PathUnescape(key)
			if err != nil {
				k = "\x00" // invalid: the handler answers idempotency_key_invalid
			}
			r.SetPathValue("key", k)
			info(r).route = operationsPattern
			operations.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

const (
	operationsPrefix  = "/v1/operations/"
	operationsPattern = operationsPrefix + "{key}"
)

// route is one path of the API and the handlers of its methods.
type route struct {
	pattern string
	methods methods
	// public routes are served without a bearer token.
	public bool
}

// routes is the API's routing table: every path and method it serves, and
// nothing else. The OpenAPI document (api/openapi.yaml) describes exactly
// these; a test holds the two to each other.
func (s *server) routes() []route {
	return []route{
		{pattern: "/v1/notes", methods: methods{http.MethodPost: s.createNote, http.MethodGet: s.listNotes}},
		{pattern: "/v1/notes/{id}", methods: methods{http.MethodGet: s.getNote, http.MethodPatch: s.updateNote, http.MethodDelete: s.deleteNote}},
		{pattern: "/v1/notes/{id}/attachment", methods: methods{http.MethodGet: s.getAttachment}},
		{pattern: "/v1/notes/{id}/attachment/content", methods: methods{http.MethodGet: s.getAttachmentContent}},
		{pattern: "/v1/notes/{id}/attachment/thumbnail", methods: methods{http.MethodGet: s.getThumbnail}},
		{pattern: webhooksPattern, methods: methods{http.MethodPost: s.createWebhook, http.MethodGet: s.listWebhooks}},
		{pattern: webhookPattern, methods: methods{http.MethodGet: s.getWebhook, http.MethodDelete: s.deleteWebhook}},
		{pattern: webhookRotatePattern, methods: methods{http.MethodPost: s.rotateWebhookSecret}},
		{pattern: operationsPattern, methods: methods{http.MethodGet: s.getOperation}},
		{pattern: limitsPattern, methods: methods{http.MethodGet: s.getLimits}},
		{pattern: "/openapi.yaml", methods: methods{http.MethodGet: getOpenAPI}, public: true},
		{pattern: schemasPattern, methods: methods{http.MethodGet: getSchema}, public: true},
		{pattern: "/asyncapi.yaml", methods: methods{http.MethodGet: getAsyncAPI}, public: true},
	}
}

// getOpenAPI serves the API's OpenAPI document, the file embedded from
// api/openapi.yaml. It needs no token: a client reads it before it has one.
func getOpenAPI(w http.ResponseWriter, r *http.Request) {
	writeDocument(w, r, api.ContentType, api.OpenAPI())
}

// writeDocument answers 200 with doc, one of the documents embedded from
// api/, as contentType with its length; a HEAD request gets the headers
// alone.
func writeDocument(w http.ResponseWriter, r *http.Request, contentType string, doc []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(doc)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(doc)
	}
}

// methods dispatches by method and answers 405 as problem+json.
type methods map[string]http.HandlerFunc

// allow lists the methods served, sorted, HEAD included wherever GET is
// (RFC 9110 §10.2.1: Allow names every supported method).
func (m methods) allow() string {
	list := make([]string, 0, len(m)+1)
	for k := range m {
		list = append(list, k)
	}
	if _, ok := m[http.MethodGet]; ok {
		if _, ok := m[http.MethodHead]; !ok {
			list = append(list, http.MethodHead)
		}
	}
	slices.Sort(list)
	return strings.Join(list, ", ")
}

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, ok := m[r.Method]
	if !ok && r.Method == http.MethodHead {
		h, ok = m[http.MethodGet]
	}
	if !ok {
		allow := m.allow()
		w.Header().Set("Allow", allow)
		writeProblem(w, r, problem.New(http.StatusMethodNotAllowed, contract.CodeMethodNotAllowed, methodName(r.Method)+" is not allowed here; allowed: "+allow))
		return
	}
	h(w, r)
}

// methodName is how a 405's detail names a method: a method HTTP
// defines by its name, any other — which may be 60 KiB of a caller's
// invention — as "this method".
func methodName(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "this method"
}

// authed resolves the bearer token to the request's tenant before h runs.
func (s *server) authed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, err := s.Auth.AuthenticateFrom(r.Context(), r.RemoteAddr, r.Header.Get("Authorization"))
		if err != nil {
			var limited *auth.RateLimitedError
			if errors.As(err, &limited) { // decision 0042
				info(r).category = contract.CodeRateLimited
				p := problem.New(http.StatusTooManyRequests, contract.CodeRateLimited,
					"too many failed authentications from this address; nothing was executed: send the same request again after Retry-After")
				p.RetryAfter = int((limited.RetryAfter + time.Second - 1) / time.Second)
				if limited.AllAddresses {
					// Not this address's budget: no RateLimit fields
					// describe it.
					p.Detail = "too many lookups of unknown tokens at once; nothing was executed: send the same request again after Retry-After"
					writeProblem(w, r, p)
					return
				}
				// The per-address budget of failed lookups, in the
				// RateLimit fields' syntax (decision 0040): a quota of
				// FailureBurst refilled over its window.
				lim := s.Auth.Limits()
				h := w.Header()
				h.Set("RateLimit-Policy", fmt.Sprintf(`"%s";q=%d;w=%d`, policyAuth, lim.FailureBurst,
					max(1, int(math.Ceil(float64(lim.FailureBurst)/lim.FailuresPerSecond)))))
				h.Set("RateLimit", fmt.Sprintf(`"%s";r=0;t=%d`, policyAuth, p.RetryAfter))
				writeProblem(w, r, p)
				return
			}
			if errors.Is(err, auth.ErrUnauthenticated) {
				info(r).category = contract.CodeUnauthenticated
				writeProblem(w, r, problem.New(http.StatusUnauthorized, contract.CodeUnauthenticated,
					"send Authorization: Bearer <token> with a valid, unrevoked token"))
				return
			}
			writeError(w, r, err)
			return
		}
		info(r).tenant = tenant
		h.ServeHTTP(w, r)
	})
}

// problemFor maps a domain error to its problem; the one place that does.
func problemFor(err error) *problem.Problem {
	var (
		verr     *validation.Error // notes' and webhooks' alike
		tooLarge *notes.TooLargeError
		reused   *idempotency.KeyReusedError
		expired  *idempotency.ExpiredError
		unavail  *idempotency.UnavailableError
		mismatch *notes.VersionMismatchError
	)
	if p := webhookProblem(err); p != nil {
		return p
	}
	switch {
	case errors.As(err, &verr):
		p := problem.New(http.StatusBadRequest, contract.CodeValidation, "the request has invalid fields; see errors")
		p.Errors = make([]problem.FieldError, len(verr.Errors))
		for i, f := range verr.Errors {
			p.Errors[i] = problem.FieldError{Field: f.Field, Message: f.Message}
		}
		return p
	case errors.As(err, &tooLarge):
		return problem.New(http.StatusRequestEntityTooLarge, contract.CodeTooLarge, tooLarge.Error())
	case errors.As(err, &reused):
		detail := "this key is recorded for different parameters; a new intent needs a new key, the same intent must send its original parameters"
		if reused.Fields[0] == "action" {
			detail = "this key is recorded for a " + reused.RecordedAction + " operation; a new intent needs a new key"
		}
		p := problem.New(http.StatusUnprocessableEntity, contract.CodeKeyReused, detail)
		p.Fields = reused.Fields
		return p
	case errors.As(err, &expired):
		p := problem.New(http.StatusGone, contract.CodeResultExpired,
			expired.Error()+"; the operation is not executed again: look the resource up instead")
		p.Resource = expired.Resource
		return p
	case errors.Is(err, idempotency.ErrInProgress):
		p := problem.New(http.StatusConflict, contract.CodeInProgress,
			"a request with this key is still executing; send the same request with the same key again")
		p.RetryAfter = 1
		return p
	case errors.Is(err, db.ErrLockTimeout):
		p := problem.New(http.StatusServiceUnavailable, contract.CodeUnavailable,
			"the note is locked by another transaction (its attachment being processed, say) for longer than the lock timeout; nothing was committed: send the same request with the same key after Retry-After")
		p.RetryAfter = 1
		return p
	case errors.Is(err, db.ErrPoolTimeout):
		p := problem.New(http.StatusServiceUnavailable, contract.CodeUnavailable,
			"every database connection is busy; nothing was changed: send the same request with the same key after Retry-After")
		p.RetryAfter = 1
		return p
	case errors.As(err, &unavail):
		detail := "the database is unavailable and nothing was committed; a retry with the same key is safe"
		if unavail.Unknown {
			detail = "the database became unavailable while committing and whether the operation committed could not be established; a retry with the same key is safe and answers with the real outcome"
		}
		p := problem.New(http.StatusServiceUnavailable, contract.CodeUnavailable, detail)
		p.RetryAfter = 1
		return p
	case errors.Is(err, db.ErrUnavailable):
		p := problem.New(http.StatusServiceUnavailable, contract.CodeUnavailable, "the database is unavailable; nothing was changed")
		p.RetryAfter = 1
		return p
	case errors.As(err, &mismatch):
		p := problem.New(http.StatusPreconditionFailed, contract.CodePreconditionFailed, fmt.Sprintf(
			"the note is at version %d, not %d as If-Match says: someone changed it since you read it; read it again (GET /v1/notes/{id}) and decide — do not resend this under a new key",
			mismatch.Current, mismatch.Expected))
		p.CurrentVersion = mismatch.Current
		return p
	case errors.Is(err, notes.ErrNothingToUpdate), errors.Is(err, notes.ErrNothingToDelete):
		return problem.New(http.StatusNotFound, contract.CodeNotFound, "no note with this id exists for this tenant (it may have been deleted)")
	case errors.Is(err, notes.ErrNotFound):
		return problem.New(http.StatusNotFound, contract.CodeNotFound, "no such note for this tenant")
	case errors.Is(err, notes.ErrOperationNotFound):
		return problem.New(http.StatusNotFound, contract.CodeOpNotFound,
			"nothing with this key is recorded for this tenant and nothing with it is executing; the write never executed, so send it again under the same key")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		p := problem.New(http.StatusServiceUnavailable, contract.CodeUnavailable, "the request was cancelled before an outcome was reached; a retry with the same key is safe")
		p.RetryAfter = 1
		return p
	default:
		return problem.New(http.StatusInternalServerError, contract.CodeInternal,
			"an unexpected error occurred and nothing was committed; a retry with the same key is safe")
	}
}

func categoryOf(p *problem.Problem) string { return p.Code }

func writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	ri := info(r)
	ri.category = categoryOf(p)
	if p.Status >= 500 {
		ri.err = err
	}
	writeProblem(w, r, p)
}

func writeProblem(w http.ResponseWriter, r *http.Request, p *problem.Problem) {
	if ri := info(r); ri != nil && ri.category == "" {
		ri.category = p.Code
	}
	p.Write(w)
}

func parseID(r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil || len(r.PathValue("id")) != 36 {
		return uuid.Nil, false
	}
	return id, true
}

// appendMillis appends us microseconds as milliseconds, the log line's
// duration_ms: what strconv.AppendFloat(dst, float64(us)/1000, 'f', -1, 64)
// appends (FuzzAppendMillis), without its search for the shortest
// representation, which was most of the log line's cost (issue 29). Below
// 2^43 µs (101 days) the exact decimal is that shortest one; beyond, and
// for a negative us, AppendFloat itself writes it.
func appendMillis(dst []byte, us int64) []byte {
	if us < 0 || us >= 1<<43 {
		return strconv.AppendFloat(dst, float64(us)/1000, 'f', -1, 64)
	}
	dst = strconv.AppendInt(dst, us/1000, 10)
	frac := us % 1000
	if frac == 0 {
		return dst
	}
	b := [4]byte{'.', byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
	n := len(b)
	for b[n-1] == '0' {
		n--
	}
	return append(dst, b[:n]...)
}
