// Package dispatch is Quill's webhook dispatcher (SPEC §11, decisions 0081
// and 0083): it consumes every event of the stream through the public
// consumer package and, in the consumer's transaction, records one delivery
// row per subscribed endpoint (webhook_deliveries); a sender in the same
// process then POSTs each due delivery to its endpoint, signed the Standard
// Webhooks way, outside any transaction and under a lease on the row, and
// marks it delivered, to be retried with backoff, or failed. A dispatcher
// that dies between a POST and its mark leaves the lease to run out: the
// POST is sent again under the same webhook-id. The package owns
// webhook_deliveries and webhook_endpoint_health; it only reads
// webhook_endpoints.
package dispatch

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// Defaults of Config (SPEC §11).
const (
	// DefaultConsumer is the durable consumer's name (QUILL_CONSUMER).
	DefaultConsumer = "webhook-dispatcher"
	// DefaultTimeout bounds one POST, from the dial to the end of the
	// answer (QUILL_WEBHOOK_TIMEOUT).
	DefaultTimeout = 10 * time.Second
	// DefaultBackoffMin and DefaultBackoffMax bound the retry backoff
	// (QUILL_WEBHOOK_BACKOFF_MIN, QUILL_WEBHOOK_BACKOFF_MAX).
	DefaultBackoffMin = 5 * time.Second
	DefaultBackoffMax = time.Hour
	// DefaultRetryFor is how long a delivery is retried after its first
	// attempt (QUILL_WEBHOOK_RETRY_FOR).
	DefaultRetryFor = 72 * time.Hour
	// DefaultDisableAfter is how long an endpoint may fail without a
	// success before it is disabled (QUILL_WEBHOOK_DISABLE_AFTER).
	DefaultDisableAfter = 5 * 24 * time.Hour
	// DefaultEndpointConcurrency is the POSTs in flight to one endpoint
	// from one process (QUILL_WEBHOOK_ENDPOINT_CONCURRENCY).
	DefaultEndpointConcurrency = 8
	// DefaultConcurrency is the POSTs in flight from one process
	// (QUILL_WEBHOOK_CONCURRENCY).
	DefaultConcurrency = 64
	// DefaultBatch is the events the dispatcher's consumer holds at once
	// and records in one transaction (QUILL_WEBHOOK_BATCH): the consumer
	// package's default, 4 held and so ~4 per transaction, capped the
	// recording at a few hundred events/s (decision 0089).
	DefaultBatch = 64
	// MaxBatch is the most QUILL_WEBHOOK_BATCH may be: the durable
	// consumer's MaxAckPending, consumer.DefaultMaxAckPending.
	MaxBatch = 1000
	// DefaultRetention is how long delivered and failed rows are kept
	// (QUILL_WEBHOOK_RETENTION).
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultPollInterval is how often the sender looks for due deliveries
	// when nothing woke it: other processes' rows and retries.
	DefaultPollInterval = time.Second
	// DefaultMaintenanceInterval is how often the dispatcher counts the
	// backlog, fails what can no longer be sent and deletes old rows.
	DefaultMaintenanceInterval = 15 * time.Second
	// LeaseMargin is added to the timeout in a claim's lease: the time to
	// mark the row after the POST ended. A mark slower than that only
	// lets another dispatcher send the delivery again, under the same id.
	LeaseMargin = 5 * time.Second
	// MaxResponseBody is the most of an answer's body read (then the
	// connection is closed): the dispatcher needs only the status.
	MaxResponseBody = 64 << 10
	// UserAgent is the User-Agent of every POST.
	UserAgent = "Quill-Webhooks/1 (+https://github.com/quillhq/quill)"
)

// Config tunes a dispatcher. Every zero field takes its default.
type Config struct {
	// Timeout bounds one POST (QUILL_WEBHOOK_TIMEOUT).
	Timeout time.Duration
	// BackoffMin and BackoffMax bound the full-jitter exponential backoff
	// between attempts (QUILL_WEBHOOK_BACKOFF_MIN/MAX).
	BackoffMin, BackoffMax time.Duration
	// RetryFor is how long after its first attempt a delivery is still
	// retried; past it a failed attempt fails the delivery
	// (QUILL_WEBHOOK_RETRY_FOR).
	RetryFor time.Duration
	// DisableAfter disables an endpoint that has failed without a success
	// for this long (QUILL_WEBHOOK_DISABLE_AFTER).
	DisableAfter time.Duration
	// EndpointConcurrency bounds the POSTs in flight to one endpoint from
	// this process (QUILL_WEBHOOK_ENDPOINT_CONCURRENCY); Concurrency bounds
	// them all (QUILL_WEBHOOK_CONCURRENCY).
	EndpointConcurrency, Concurrency int
	// Batch is the events this process's consumer holds at once and
	// records in one transaction, group-committed (QUILL_WEBHOOK_BATCH):
	// the consumer's Concurrency and MaxBatch.
	Batch int
	// AllowPrivate lifts the https-only and public-address rules
	// (QUILL_WEBHOOK_ALLOW_PRIVATE): for development and tests.
	AllowPrivate bool
	// TLSCA is a PEM file of extra root certificates for endpoints under a
	// private CA (QUILL_WEBHOOK_TLS_CA); empty: the system's roots only.
	TLSCA string
	// Retention is how long delivered and failed rows are kept
	// (QUILL_WEBHOOK_RETENTION).
	Retention time.Duration
	// PollInterval is the sender's poll (due retries, other processes'
	// rows); MaintenanceInterval the backlog gauge's and the cleanup's.
	PollInterval, MaintenanceInterval time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.BackoffMin = cmp.Or(c.BackoffMin, DefaultBackoffMin)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.RetryFor = cmp.Or(c.RetryFor, DefaultRetryFor)
	c.DisableAfter = cmp.Or(c.DisableAfter, DefaultDisableAfter)
	c.EndpointConcurrency = cmp.Or(c.EndpointConcurrency, DefaultEndpointConcurrency)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.MaintenanceInterval = cmp.Or(c.MaintenanceInterval, DefaultMaintenanceInterval)
	return c
}

// Validate returns an error naming the setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Timeout <= 0:
		return fmt.Errorf("QUILL_WEBHOOK_TIMEOUT %s must be positive", c.Timeout)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("QUILL_WEBHOOK_BACKOFF_MIN %s must be positive and not above QUILL_WEBHOOK_BACKOFF_MAX %s", c.BackoffMin, c.BackoffMax)
	case c.RetryFor <= 0:
		return fmt.Errorf("QUILL_WEBHOOK_RETRY_FOR %s must be positive", c.RetryFor)
	case c.DisableAfter <= 0:
		return fmt.Errorf("QUILL_WEBHOOK_DISABLE_AFTER %s must be positive", c.DisableAfter)
	case c.EndpointConcurrency < 1:
		return errors.New("QUILL_WEBHOOK_ENDPOINT_CONCURRENCY must be at least 1")
	case c.Concurrency < c.EndpointConcurrency:
		return fmt.Errorf("QUILL_WEBHOOK_CONCURRENCY %d must be at least QUILL_WEBHOOK_ENDPOINT_CONCURRENCY %d", c.Concurrency, c.EndpointConcurrency)
	case c.Batch < 1 || c.Batch > MaxBatch:
		return fmt.Errorf("QUILL_WEBHOOK_BATCH %d must be from 1 to %d", c.Batch, MaxBatch)
	case c.Retention <= 0:
		return fmt.Errorf("QUILL_WEBHOOK_RETENTION %s must be positive", c.Retention)
	}
	return nil
}

// lease is how long a claim holds a delivery: the POST's timeout and the
// time to mark it.
func (c Config) lease() time.Duration { return c.Timeout + LeaseMargin }
