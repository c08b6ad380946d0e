// Package client is the Go client of Quill's HTTP API, built for callers —
// AI agents above all — on an unreliable network.
//
// Every write (CreateNote, UpdateNote, DeleteNote, and the webhook
// endpoints' CreateWebhook, DeleteWebhook, RotateWebhookSecret) belongs to one operation
// named by an operation key. Pass WithKey to name it yourself (one key per
// user intent); otherwise the client makes one for the call. Retries of that
// call always reuse the key, so however often the request is delivered the
// server executes it once. Retries are bounded by an attempt limit and a total
// deadline, spaced by exponential backoff with full jitter and Retry-After
// (capped by MaxRetryAfter), and only happen when they are safe: the
// problem's retry advice is same_key (409 operation_in_progress, 429
// rate_limited, 503 unavailable), or the outcome is unknown (a timeout, a
// connection lost after the request was sent, a 5xx without a problem
// document). When attempts run out
// with the outcome unknown, the client looks the key up; if that cannot
// settle it either, the write returns an *UnknownOutcomeError carrying the
// key — never a plain failure.
//
// An edit names the version it was decided on: UpdateNote (and
// DeleteNoteIfVersion) send it as If-Match, and a note at another version
// is a final refusal, 412 precondition_failed with Problem.CurrentVersion —
// read the note again and decide; a retry under a new key would overwrite
// the change it missed.
//
// With a Journal (FileJournal), each write is recorded durably before its
// first send and settled after its final answer, so that Resume, after a
// crash or restart, finishes unsettled operations under their original keys
// instead of planning them again.
//
// A webhook endpoint's signing secret is in the answer of its create or
// rotation only (and in that answer's replays under the same key): the
// client returns it to the caller and never writes it to the journal, and
// a create or rotation whose answer was lost is not done until a resend
// under its key has brought the secret (ErrSecretNotReceived).
package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
)

// Defaults of Config.
const (
	DefaultAttempts       = 5
	DefaultDeadline       = 30 * time.Second
	DefaultAttemptTimeout = 10 * time.Second
	DefaultLookupTimeout  = 5 * time.Second
	DefaultBaseDelay      = 100 * time.Millisecond
	DefaultMaxDelay       = 5 * time.Second
	// DefaultMaxRetryAfter caps the wait a server's Retry-After asks for.
	DefaultMaxRetryAfter = 10 * time.Second
	// DefaultKeyRetention is the server's default QUILL_KEY_RETENTION.
	// The client does not assume it (a server may run with less): it
	// reads the server's (Config.KeyRetention).
	DefaultKeyRetention = 720 * time.Hour
)

// maxResponseBytes bounds a response body the client reads.
const maxResponseBytes = 16 << 20

// Config configures a Client. BaseURL and Token are required.
type Config struct {
	// BaseURL is the API's address, such as http://127.0.0.1:8080.
	BaseURL string
	// Token is the bearer token; it decides the tenant.
	Token string
	// HTTPClient sends the requests. Default: a client with its own
	// transport and no overall timeout (the client sets its own).
	HTTPClient *http.Client
	// Attempts is the most requests one call sends. Default 5.
	Attempts int
	// Deadline bounds one call in total: every attempt, every backoff
	// delay and the final lookup. Default 30s.
	Deadline time.Duration
	// AttemptTimeout bounds one request. Default 10s.
	AttemptTimeout time.Duration
	// LookupTimeout is the part of Deadline kept for looking the key up
	// when attempts run out (at most a quarter of Deadline). Default 5s.
	LookupTimeout time.Duration
	// BaseDelay is the backoff before the first retry; each further
	// retry doubles it, up to MaxDelay, and the delay actually waited is
	// uniformly random below that (full jitter). Defaults 100ms and 5s.
	BaseDelay, MaxDelay time.Duration
	// MaxRetryAfter caps the wait before a retry that a Retry-After (of a
	// 409, 429 or 503) asks for, so that a misconfigured or hostile answer
	// cannot park the caller; a longer Retry-After is waited this long, and
	// the retry counts against Attempts as any other. Default 10s.
	MaxRetryAfter time.Duration
	// KeyRetention is the server's QUILL_KEY_RETENTION: a key first sent
	// longer ago is never sent again (ErrKeyTooOld), as the server may
	// have forgotten it. Set, it wins over the server's. Default: the
	// server's key_retention, read from GET /v1/limits the first time a
	// key sent before is to be sent again (see Limits); while that cannot
	// be read, keys older than FallbackKeyRetention are not resent. A key
	// never sent before needs no retention and never waits for it.
	KeyRetention time.Duration
	// Journal, when set, records each write before its first send and
	// its final outcome after. Default none.
	Journal Journal
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	c.Attempts = cmp.Or(c.Attempts, DefaultAttempts)
	c.Deadline = cmp.Or(c.Deadline, DefaultDeadline)
	c.AttemptTimeout = cmp.Or(c.AttemptTimeout, DefaultAttemptTimeout)
	c.LookupTimeout = cmp.Or(c.LookupTimeout, DefaultLookupTimeout)
	c.BaseDelay = cmp.Or(c.BaseDelay, DefaultBaseDelay)
	c.MaxDelay = cmp.Or(c.MaxDelay, DefaultMaxDelay)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	u, err := url.Parse(c.BaseURL)
	switch {
	case c.BaseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("BaseURL %q must be an http(s) URL with a host", c.BaseURL)
	case c.Token == "":
		return errors.New("token is required")
	case c.Attempts < 1:
		return fmt.Errorf("attempts is %d, must be at least 1", c.Attempts)
	case c.Deadline < 0, c.AttemptTimeout < 0, c.LookupTimeout < 0, c.BaseDelay < 0, c.MaxDelay < 0, c.MaxRetryAfter < 0, c.KeyRetention < 0:
		return errors.New("durations must not be negative")
	}
	return nil
}

// Client calls the Quill API. It is safe for concurrent use.
type Client struct {
	cfg    Config
	base   string
	limits limitsCache
}

// New returns a client for cfg. It returns an error naming the field when
// the configuration is invalid.
func New(cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	return &Client{cfg: cfg, base: strings.TrimRight(cfg.BaseURL, "/")}, nil
}

// Config returns the client's configuration, defaults applied.
func (c *Client) Config() Config { return c.cfg }

// WriteOption adjusts one write.
type WriteOption func(*writeOpts)

type writeOpts struct {
	key       string
	firstSent time.Time
}

// WithKey sends the write under key, the operation key of one user intent.
// Use the same key for every retry of that intent, and a new key for a new
// intent. A key is 1–255 characters of 0x21–0x7E except '"' and ','.
func WithKey(key string) WriteOption { return func(o *writeOpts) { o.key = key } }

// WithFirstSent says when key was first sent, when the caller keeps it
// without a Journal: a key older than the key retention (Config.KeyRetention,
// else the server's) is refused with ErrKeyTooOld.
func WithFirstSent(t time.Time) WriteOption { return func(o *writeOpts) { o.firstSent = t } }

// NewKey returns a fresh operation key, for a caller that wants to hold the
// key of an intent before its first call.
func (c *Client) NewKey() string { return uuid.Must(uuid.NewV7()).String() }

// CreateNote creates a note as one operation (POST /v1/notes). It returns
// a *RefusedError for a final refusal (validation, 422 key reused, ...), an
// *UnknownOutcomeError when the outcome could not be established, and
// ErrKeyTooOld or a journal error before sending.
func (c *Client) CreateNote(ctx context.Context, n NewNote, opts ...WriteOption) (*Created, error) {
	params, err := json.Marshal(n)
	if err != nil {
		return nil, fmt.Errorf("encode note: %w", err)
	}
	var out Created
	w, err := c.write(ctx, request{action: contract.ActionCreateNote, method: http.MethodPost, path: contract.NotesPath,
		params: params, body: params}, &out.Note, opts)
	out.Write = noteVersion(w, out.Note)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// MaxVersion is the largest version an If-Match can name (2^31-1).
const MaxVersion = 1<<31 - 1

// UpdateNote changes a note as one operation (PATCH /v1/notes/{id} with
// If-Match: "<ifVersion>"): the fields set in fields, provided the note is
// still at ifVersion, the version the caller last read. The answer is the
// note at its new version, or unchanged when it already had those values.
// ifVersion is part of the operation's parameters: a retry under the same
// key replays the recorded answer even when the note changed since.
//
// key is the operation key of the intent, as WithKey would give it (which
// it overrides); empty, the client makes one (or takes WithKey's). opts
// may also say when key was first sent (WithFirstSent).
//
// A note at another version is a *RefusedError whose Problem has code
// precondition_failed and CurrentVersion: final — read the note again and
// decide; resending the update under a new key would overwrite the change
// it missed. No live note with id is a final not_found; the other errors
// are CreateNote's. An ifVersion outside 1..MaxVersion, or fields setting
// neither Title nor Body, is an error before anything is journalled or
// sent.
func (c *Client) UpdateNote(ctx context.Context, id string, ifVersion int, fields NoteUpdate, key string, opts ...WriteOption) (*Updated, error) {
	if err := checkVersion(ifVersion); err != nil {
		return nil, err
	}
	if fields.Title == nil && fields.Body == nil {
		return nil, errors.New("update note: nothing to change: set Title or Body")
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("encode update: %w", err)
	}
	params, err := json.Marshal(updateParams{ID: id, IfVersion: ifVersion, Title: fields.Title, Body: fields.Body})
	if err != nil {
		return nil, fmt.Errorf("encode update: %w", err)
	}
	if key != "" {
		opts = append(opts[:len(opts):len(opts)], WithKey(key))
	}
	var out Updated
	w, err := c.write(ctx, request{action: contract.ActionUpdateNote, method: http.MethodPatch, path: contract.NotePath(id),
		params: params, body: body, ifVersion: ifVersion}, &out.Note, opts)
	out.Write = noteVersion(w, out.Note)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteNote deletes a note as one operation (DELETE /v1/notes/{id}),
// whatever its version. Its errors are CreateNote's.
func (c *Client) DeleteNote(ctx context.Context, id string, opts ...WriteOption) (*Deleted, error) {
	return c.deleteNote(ctx, deleteParams{ID: id}, opts)
}

// DeleteNoteIfVersion deletes a note as one operation (DELETE
// /v1/notes/{id} with If-Match: "<ifVersion>") provided it is still at
// ifVersion. A note at another version is a final precondition_failed, as
// for UpdateNote; the other errors are DeleteNote's. An ifVersion outside
// 1..MaxVersion is an error before anything is journalled or sent.
func (c *Client) DeleteNoteIfVersion(ctx context.Context, id string, ifVersion int, opts ...WriteOption) (*Deleted, error) {
	if err := checkVersion(ifVersion); err != nil {
		return nil, err
	}
	return c.deleteNote(ctx, deleteParams{ID: id, IfVersion: ifVersion}, opts)
}

func (c *Client) deleteNote(ctx context.Context, p deleteParams, opts []WriteOption) (*Deleted, error) {
	params, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode delete: %w", err)
	}
	var out Deleted
	w, err := c.write(ctx, request{action: contract.ActionDeleteNote, method: http.MethodDelete, path: contract.NotePath(p.ID),
		params: params, ifVersion: p.IfVersion}, &out.Deletion, opts)
	out.Write = w
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// deleteParams are a delete's journalled parameters. IfVersion is omitted
// when no If-Match is sent, so that such a record reads as it did before
// edits.
type deleteParams struct {
	ID        string `json:"id"`
	IfVersion int    `json:"if_version,omitempty"`
}

// updateParams are an update's journalled parameters: what UpdateNote was
// called with.
type updateParams struct {
	ID        string  `json:"id"`
	IfVersion int     `json:"if_version"`
	Title     *string `json:"title,omitempty"`
	Body      *string `json:"body,omitempty"`
}

func checkVersion(v int) error {
	if v < 1 || v > MaxVersion {
		return fmt.Errorf("if-version %d: a version is 1..%d", v, MaxVersion)
	}
	return nil
}

// noteVersion fills w.Version from the note when the answer had no ETag
// (one recovered by lookup).
func noteVersion(w Write, n Note) Write {
	if w.Version == 0 {
		w.Version = n.Version
	}
	return w
}

// etagVersion returns the version a strong ETag "N" names, or 0.
func etagVersion(v string) int {
	if len(v) < 3 || v[0] != '"' || v[len(v)-1] != '"' {
		return 0
	}
	digits := v[1 : len(v)-1]
	if digits[0] == '0' {
		return 0
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 1 || n > MaxVersion || strconv.Itoa(n) != digits {
		return 0
	}
	return n
}

// GetNote returns a note (GET /v1/notes/{id}); a missing one is a *Problem
// with code not_found.
func (c *Client) GetNote(ctx context.Context, id string) (*Note, error) {
	var n Note
	if _, err := c.read(ctx, contract.NotePath(id), &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// ListOptions selects a page of ListNotes.
type ListOptions struct {
	// Limit is 1–100; 0 means the server's default (50).
	Limit int
	// Cursor is a previous page's NextCursor.
	Cursor string
}

// ListNotes returns one page of notes, newest first (GET /v1/notes).
func (c *Client) ListNotes(ctx context.Context, o ListOptions) (*NoteList, error) {
	q := url.Values{}
	if o.Limit != 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	path := contract.NotesPath
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var l NoteList
	if _, err := c.read(ctx, path, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetOperation looks an operation key up (GET /v1/operations/{key}). A key
// the server has no record of is a *Problem with code operation_not_found.
func (c *Client) GetOperation(ctx context.Context, key string) (*Operation, error) {
	k, err := opkey.Parse(key)
	if err != nil {
		return nil, err
	}
	var op Operation
	raw, err := c.read(ctx, operationPath(k), &op)
	if err != nil {
		return nil, err
	}
	op.Raw = raw
	return &op, nil
}

func operationPath(key string) string { return "/v1/operations/" + url.PathEscape(key) }

// errUndecodable marks a success answer whose body is not what was asked
// for.
var errUndecodable = errors.New("the answer is not the expected JSON")

// answer is one HTTP exchange's result.
type answer struct {
	status   int
	header   http.Header
	body     []byte
	problem  *Problem
	replayed bool
	err      error
}

// request is one write's HTTP request and what is journalled of it.
type request struct {
	action, method, path string
	// params are journalled; body is sent (nil: no body).
	params, body []byte
	// ifVersion, when not 0, is sent as If-Match.
	ifVersion int
	// secret: a success's answer carries a secret (a webhook create or
	// rotation), which the journal does not keep and the lookup does not
	// show.
	secret bool
}

// journalled is what the journal keeps of a success's body: all of it,
// or for an answer carrying a secret, all but the secret.
func (r request) journalled(body []byte) []byte {
	if r.secret {
		return withoutSecret(body)
	}
	return body
}

// send makes one request within ctx; ifVersion, when not 0, is sent as
// If-Match.
func (c *Client) send(ctx context.Context, method, path, key string, body []byte, ifVersion int) answer {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", "quill-go-client/1")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if ifVersion != 0 {
		req.Header.Set("If-Match", `"`+strconv.Itoa(ifVersion)+`"`)
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		// The status arrived but not the whole body: as good as no
		// answer.
		return answer{err: fmt.Errorf("read response: %w", err)}
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: raw,
		replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if resp.StatusCode >= 300 {
		a.problem = parseProblem(resp.Header.Get("Content-Type"), raw, resp.StatusCode)
		if a.problem != nil {
			a.problem.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), c.cfg.Now())
		}
	}
	return a
}

// parseProblem decodes a problem document, or returns nil when the body is
// not one (a proxy's or a crashed server's answer).
func parseProblem(contentType string, body []byte, status int) *Problem {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt != "application/problem+json" && mt != "application/json" {
		return nil
	}
	var p Problem
	if err := json.Unmarshal(body, &p); err != nil || p.Code == "" {
		return nil
	}
	if p.Status == 0 {
		p.Status = status
	}
	return &p
}

// syntheticProblem stands for an error answer without a problem document.
func syntheticProblem(a answer) *Problem {
	detail := strings.TrimSpace(string(a.body))
	if len(detail) > 200 {
		detail = detail[:200] + "…"
	}
	return &Problem{Status: a.status, Title: http.StatusText(a.status), Detail: detail, Retry: contract.RetryNo}
}

// attemptLoop sends a request until it is done, refused or out of attempts
// or time. It returns the last answer, its verdict, the number of requests
// sent and whether any of them may have reached the server.
func (c *Client) attemptLoop(parent, ctx context.Context, method, path, key string, body []byte, ifVersion int) (answer, verdict, int, bool) {
	var (
		a     answer
		v     verdict
		sent  bool
		tries int
	)
	for tries < c.cfg.Attempts {
		tries++
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		a = c.send(actx, method, path, key, body, ifVersion)
		cancel()
		v = classify(parent, a.status, a.problem, a.err)
		if v != verdictRetryUnsent {
			sent = true
		}
		if v == verdictDone || v == verdictRefused || v == verdictStop || tries == c.cfg.Attempts {
			break
		}
		delay := backoff(tries, c.cfg.BaseDelay, c.cfg.MaxDelay, rand.Float64)
		var ra time.Duration
		switch {
		case a.problem != nil:
			ra = a.problem.RetryAfter
		case a.err == nil:
			ra = parseRetryAfter(a.header.Get("Retry-After"), c.cfg.Now())
		}
		if ra = min(ra, c.cfg.MaxRetryAfter); ra > delay {
			delay = ra
		}
		if dl, ok := ctx.Deadline(); ok && c.cfg.Now().Add(delay).After(dl) {
			break // no time for another attempt
		}
		if !sleep(ctx, delay) {
			break
		}
	}
	if ctx.Err() != nil && parent.Err() != nil && v != verdictDone && v != verdictRefused {
		v = verdictStop
	}
	return a, v, tries, sent
}

// read performs a GET with retries; reads are safe to repeat. It decodes a
// 2xx body into out and returns the raw body.
func (c *Client) read(parent context.Context, path string, out any) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(parent, c.cfg.Deadline)
	defer cancel()
	a, v, tries, _ := c.attemptLoop(parent, ctx, http.MethodGet, path, "", nil, 0)
	switch v {
	case verdictDone:
		if err := json.Unmarshal(a.body, out); err != nil {
			return nil, fmt.Errorf("decode %s: %w: %w", path, errUndecodable, err)
		}
		return a.body, nil
	case verdictRefused:
		if a.problem != nil {
			return nil, a.problem
		}
		return nil, syntheticProblem(a)
	}
	if a.err != nil {
		return nil, fmt.Errorf("GET %s: no answer after %d attempts: %w", path, tries, a.err)
	}
	if a.problem != nil {
		return nil, fmt.Errorf("GET %s: gave up after %d attempts: %w", path, tries, a.problem)
	}
	return nil, fmt.Errorf("GET %s: gave up after %d attempts: HTTP %d", path, tries, a.status)
}

// write runs one operation: journal, attempts, lookup, settlement.
func (c *Client) write(ctx context.Context, r request, out any, opts []WriteOption) (Write, error) {
	var o writeOpts
	for _, f := range opts {
		f(&o)
	}
	key := o.key
	if key == "" {
		key = c.NewKey()
	}
	key, err := opkey.Parse(key)
	if err != nil {
		return Write{Key: o.key}, fmt.Errorf("operation key: %w", err)
	}
	w := Write{Key: key}
	// firstSent is when the key was sent before, if it was: zero for a
	// key this write sends for the first time, which no retention can
	// have expired and which must not wait for the server's limits.
	firstSent := o.firstSent
	if c.cfg.Journal != nil {
		now := c.cfg.Now().UTC()
		e, err := c.cfg.Journal.Begin(ctx, JournalEntry{Key: key, Action: r.action, Params: r.params, CreatedAt: now})
		if err != nil {
			return w, fmt.Errorf("journal operation %q before sending: %w", key, err)
		}
		if e.CreatedAt.Before(now) && (firstSent.IsZero() || e.CreatedAt.Before(firstSent)) {
			firstSent = e.CreatedAt // journalled by an earlier write
		}
	}
	if !firstSent.IsZero() {
		if err := c.checkKeyAge(ctx, key, firstSent); err != nil {
			return w, err
		}
	}

	start := c.cfg.Now()
	total, cancel := context.WithDeadline(ctx, start.Add(c.cfg.Deadline))
	defer cancel()
	reserve := min(c.cfg.LookupTimeout, c.cfg.Deadline/4)
	attempts, cancelAttempts := context.WithDeadline(total, start.Add(c.cfg.Deadline-reserve))
	defer cancelAttempts()

	a, v, tries, sent := c.attemptLoop(ctx, attempts, r.method, r.path, key, r.body, r.ifVersion)
	w.Attempts = tries
	w.Replayed = a.replayed
	switch v {
	case verdictDone:
		w.Version = etagVersion(a.header.Get("ETag"))
		if err := json.Unmarshal(a.body, out); err != nil {
			// The operation completed; only its answer is unreadable.
			return w, fmt.Errorf("operation %q completed, but its answer could not be decoded: %w", key, err)
		}
		c.settle(ctx, key, Settlement{State: StateCompleted, Status: a.status, Body: r.journalled(a.body)})
		return w, nil
	case verdictRefused:
		p := a.problem
		if p == nil {
			p = syntheticProblem(a)
		}
		if p.Code != "" { // a synthetic problem is not the server's word
			c.settle(ctx, key, Settlement{State: StateRefused, Status: a.status, Body: a.body})
		}
		return w, &RefusedError{Key: key, Replayed: a.replayed, Problem: p}
	}

	cause := a.err
	if cause == nil {
		if a.problem != nil {
			cause = a.problem
		} else {
			cause = fmt.Errorf("HTTP %d without a problem document", a.status)
		}
	}
	unknown := &UnknownOutcomeError{Key: key, Action: r.action, Attempts: tries, Cause: cause}
	if !sent {
		// No request ever reached the server; it did not execute.
		unknown.Lookup = "not_sent"
		return w, unknown
	}
	if ctx.Err() != nil {
		unknown.Lookup = "skipped"
		return w, unknown
	}
	op, lerr := c.lookupSettled(total, key)
	switch {
	case lerr != nil:
		unknown.Lookup = "failed"
		var p *Problem
		if errors.As(lerr, &p) && p.Code == contract.CodeOpNotFound {
			unknown.Lookup = "not_found"
		}
		return w, unknown
	case op.State != contract.OperationCompleted || op.Response == nil:
		unknown.Lookup = contract.OperationInProgress
		return w, unknown
	}
	// The lookup has the recorded answer: the operation's real outcome.
	w.Replayed = true
	st := op.Response.Status
	if st >= 200 && st < 300 && r.secret {
		// The lookup shows the secret as null: only a replay of the
		// answer carries it. One more send, in what is left of the
		// deadline, may bring it; otherwise the operation stays
		// unsettled, for a resend under its key (Resume).
		actx, cancel := context.WithTimeout(total, c.cfg.AttemptTimeout)
		a := c.send(actx, r.method, r.path, key, r.body, r.ifVersion)
		cancel()
		w.Attempts++
		if a.err == nil && a.status >= 200 && a.status < 300 && json.Unmarshal(a.body, out) == nil {
			c.settle(ctx, key, Settlement{State: StateCompleted, Status: a.status, Body: r.journalled(a.body)})
			return w, nil
		}
		unknown.Lookup = contract.OperationCompleted
		unknown.Attempts = w.Attempts
		unknown.Cause = fmt.Errorf("%w (the lookup says it completed; the last attempt: %w)", ErrSecretNotReceived, cause)
		return w, unknown
	}
	if st >= 200 && st < 300 {
		if err := json.Unmarshal(op.Response.Body, out); err != nil {
			return w, fmt.Errorf("operation %q completed, but its recorded answer could not be decoded: %w", key, err)
		}
		c.settle(ctx, key, Settlement{State: StateCompleted, Status: st, Body: op.Response.Body})
		return w, nil
	}
	p := parseProblem("application/problem+json", op.Response.Body, st)
	if p == nil {
		p = &Problem{Status: st, Retry: contract.RetryNo, Detail: string(op.Response.Body)}
	}
	c.settle(ctx, key, Settlement{State: StateRefused, Status: st, Body: op.Response.Body})
	return w, &RefusedError{Key: key, Replayed: true, Problem: p}
}

// lookupSettled looks key up, trying again within ctx while the lookup
// itself gets no answer.
func (c *Client) lookupSettled(ctx context.Context, key string) (*Operation, error) {
	var err error
	for i := 1; ; i++ {
		var op *Operation
		actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		a := c.send(actx, http.MethodGet, operationPath(key), "", nil, 0)
		cancel()
		switch {
		case a.err == nil && a.status == http.StatusOK:
			op = &Operation{}
			if err := json.Unmarshal(a.body, op); err != nil {
				return nil, fmt.Errorf("decode lookup: %w", err)
			}
			op.Raw = a.body
			return op, nil
		case a.err == nil && a.problem != nil && (a.problem.Code == contract.CodeOpNotFound || a.problem.Retry != contract.RetrySameKey):
			// operation_in_progress, rate_limited and unavailable
			// (same_key) are answers for now; anything else, and
			// operation_not_found, is the lookup's answer.
			return nil, a.problem
		case a.err != nil:
			err = a.err
		default:
			err = fmt.Errorf("lookup: HTTP %d", a.status)
		}
		if i >= 3 || !sleep(ctx, backoff(i, c.cfg.BaseDelay, c.cfg.MaxDelay, rand.Float64)) {
			return nil, err
		}
	}
}

// settle records a final outcome in the journal. A failure to record it is
// not the write's failure: the operation stays unsettled, and a resume
// replays its recorded answer.
func (c *Client) settle(ctx context.Context, key string, s Settlement) {
	if c.cfg.Journal == nil {
		return
	}
	s.At = c.cfg.Now().UTC()
	_ = c.cfg.Journal.Settle(context.WithoutCancel(ctx), key, s)
}
