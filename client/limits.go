package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/quillhq/quill/contract"
)

// FallbackKeyRetention is the age up to which a key is still resent when the
// server's key retention is unknown: Config.KeyRetention is not set and GET
// /v1/limits could not be read (the server is unreachable, or too old to
// serve it). An older key is refused with ErrKeyTooOld, since the server
// may have forgotten it and would then execute the operation again; a key
// never sent before is always sent (decision 0047).
const FallbackKeyRetention = time.Hour

// ErrLimitsUnavailable is wrapped by the errors of Limits: the server's
// limits could not be read.
var ErrLimitsUnavailable = errors.New("the server's limits could not be read")

// Limits are the server's horizons and limits (GET /v1/limits). In JSON
// they are the server's object, durations as Go duration strings ("720h").
type Limits struct {
	// ResponseRetention is how long the server replays a completed
	// operation's response (QUILL_IDEMPOTENCY_RETENTION).
	ResponseRetention time.Duration
	// KeyRetention is how long the server remembers a key at all
	// (QUILL_KEY_RETENTION): a key first sent longer ago may execute
	// again, so the client never resends one.
	KeyRetention time.Duration
	// MaxBodyBytes is the largest request body (QUILL_MAX_BODY_BYTES).
	MaxBodyBytes int64
	// MaxAttachmentBytes is the largest decoded attachment
	// (QUILL_MAX_ATTACHMENT_BYTES).
	MaxAttachmentBytes int64
	// TenantConcurrency is the number of the tenant's requests the
	// server works on at once (QUILL_TENANT_CONCURRENCY).
	TenantConcurrency int
}

type limitsJSON struct {
	ResponseRetention  string `json:"response_retention"`
	KeyRetention       string `json:"key_retention"`
	MaxBodyBytes       int64  `json:"max_body_bytes"`
	MaxAttachmentBytes int64  `json:"max_attachment_bytes"`
	TenantConcurrency  int    `json:"tenant_concurrency"`
}

// MarshalJSON writes l as the server's object.
func (l Limits) MarshalJSON() ([]byte, error) {
	return json.Marshal(limitsJSON{
		ResponseRetention: contract.FormatDuration(l.ResponseRetention), KeyRetention: contract.FormatDuration(l.KeyRetention),
		MaxBodyBytes: l.MaxBodyBytes, MaxAttachmentBytes: l.MaxAttachmentBytes, TenantConcurrency: l.TenantConcurrency,
	})
}

// UnmarshalJSON reads the server's object. It returns an error when a
// retention is missing, not a Go duration or not positive: a client must
// not guess the horizon it checks keys against.
func (l *Limits) UnmarshalJSON(b []byte) error {
	var w limitsJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	rr, err := time.ParseDuration(w.ResponseRetention)
	if err != nil || rr <= 0 {
		return fmt.Errorf("response_retention %q is not a positive duration", w.ResponseRetention)
	}
	kr, err := time.ParseDuration(w.KeyRetention)
	if err != nil || kr <= 0 {
		return fmt.Errorf("key_retention %q is not a positive duration", w.KeyRetention)
	}
	*l = Limits{ResponseRetention: rr, KeyRetention: kr, MaxBodyBytes: w.MaxBodyBytes,
		MaxAttachmentBytes: w.MaxAttachmentBytes, TenantConcurrency: w.TenantConcurrency}
	return nil
}

// limitsCache holds the server's limits once read, for the client's life.
type limitsCache struct {
	mu  sync.Mutex
	got *Limits
	// gone is a failure that asking again will not mend: the server does
	// not serve /v1/limits (an older server) or answers something that
	// is not the limits.
	gone error
	// reading is closed when the read under way ends; nil when none is.
	reading chan struct{}
}

// Limits returns the server's horizons and limits (GET /v1/limits). They
// are read once, on the first call, and kept for the client's life: the
// server's settings change only with a restart. A failure is not kept
// unless it is final (the server does not serve the route, or answers
// something else), so a later call asks again. Errors wrap
// ErrLimitsUnavailable and, where the server answered, its *Problem.
func (c *Client) Limits(ctx context.Context) (Limits, error) {
	for {
		c.limits.mu.Lock()
		if l := c.limits.got; l != nil {
			c.limits.mu.Unlock()
			return *l, nil
		}
		if err := c.limits.gone; err != nil {
			c.limits.mu.Unlock()
			return Limits{}, err
		}
		if w := c.limits.reading; w != nil {
			// Another call is reading them: wait for it rather than send
			// a second request, then look again.
			c.limits.mu.Unlock()
			select {
			case <-w:
				continue
			case <-ctx.Done():
				return Limits{}, fmt.Errorf("%w: %w", ErrLimitsUnavailable, ctx.Err())
			}
		}
		w := make(chan struct{})
		c.limits.reading = w
		c.limits.mu.Unlock()

		l, err, final := c.readLimits(ctx)
		c.limits.mu.Lock()
		c.limits.reading = nil
		switch {
		case err == nil:
			c.limits.got = &l
		case final:
			c.limits.gone = err
		}
		c.limits.mu.Unlock()
		close(w)
		return l, err
	}
}

// readLimits sends GET /v1/limits; final reports a failure that asking
// again will not mend.
func (c *Client) readLimits(ctx context.Context) (Limits, error, bool) {
	var l Limits
	_, err := c.read(ctx, "/v1/limits", &l)
	if err == nil {
		return l, nil, false
	}
	// An older server answers 404 (405 from one that routes the prefix);
	// a 2xx that is not the limits will not become them either.
	var p *Problem
	final := errors.As(err, &p) && (p.Status == http.StatusNotFound || p.Status == http.StatusMethodNotAllowed) ||
		errors.Is(err, errUndecodable)
	return Limits{}, fmt.Errorf("%w: %w", ErrLimitsUnavailable, err), final
}

// keyRetention is the horizon a key's age is checked against:
// Config.KeyRetention when set, else the server's. The server's is read
// within the lookup's share of the deadline, so that an unreachable server
// delays a resend by no more than that.
func (c *Client) keyRetention(ctx context.Context) (time.Duration, error) {
	if c.cfg.KeyRetention > 0 {
		return c.cfg.KeyRetention, nil
	}
	lctx, cancel := context.WithTimeout(ctx, min(c.cfg.LookupTimeout, c.cfg.Deadline))
	defer cancel()
	l, err := c.Limits(lctx)
	if err != nil {
		return 0, err
	}
	return l.KeyRetention, nil
}

// checkKeyAge refuses, with ErrKeyTooOld, to resend key when it was first
// sent at least the key retention ago, or, when the retention cannot be
// known, at least FallbackKeyRetention ago.
func (c *Client) checkKeyAge(ctx context.Context, key string, firstSent time.Time) error {
	age := c.cfg.Now().Sub(firstSent)
	retention, err := c.keyRetention(ctx)
	switch {
	case err == nil && age < retention:
		return nil
	case err == nil:
		return fmt.Errorf("%w: key %q was first sent at %s, %s ago, and the server's key retention is %s; look it up instead of resending",
			ErrKeyTooOld, key, firstSent.UTC().Format(time.RFC3339), age.Round(time.Second), contract.FormatDuration(retention))
	case age < FallbackKeyRetention:
		return nil
	default:
		return fmt.Errorf("%w: key %q was first sent at %s, %s ago, and the server's key retention is unknown (%w); without it no key older than %s is resent: look it up, or set the key retention",
			ErrKeyTooOld, key, firstSent.UTC().Format(time.RFC3339), age.Round(time.Second), err, contract.FormatDuration(FallbackKeyRetention))
	}
}
