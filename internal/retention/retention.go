// Package retention applies Quill's retention horizons (SPEC §4.7, §6): it
// deletes published outbox events past the outbox retention, compacts
// operation records past their response retention to tombstones, forgets
// them past their key retention, and deletes consumers' inbox rows, and
// their version-guard rows of deleted notes, past the inbox retention — in
// small batches, so that it never holds many locks.
// It is a service of its own, run beside the relay; several may run at
// once against one database.
package retention

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
)

// Defaults of Config.
const (
	DefaultOutboxRetention = 168 * time.Hour
	DefaultInboxRetention  = 336 * time.Hour
	DefaultInterval        = time.Minute
	DefaultBatch           = 500
)

// Config tunes a Cleaner. Every zero field takes its default.
type Config struct {
	// OutboxRetention: published events are deleted after it
	// (QUILL_OUTBOX_RETENTION). Default 168h.
	OutboxRetention time.Duration
	// InboxRetention: consumers' inbox rows are deleted after it
	// (QUILL_INBOX_RETENTION); at least the stream's MaxAge (see
	// CoversStream). Default 336h.
	InboxRetention time.Duration
	// Interval is how often a pass runs. Default 1m.
	Interval time.Duration
	// Batch is how many rows one cleanup statement touches. Default 500.
	Batch int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.OutboxRetention = cmp.Or(c.OutboxRetention, DefaultOutboxRetention)
	c.InboxRetention = cmp.Or(c.InboxRetention, DefaultInboxRetention)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	return c
}

// Validate returns an error naming the settings when a horizon, the
// interval or the batch is not positive.
func (c Config) Validate() error {
	if c.OutboxRetention <= 0 || c.Interval <= 0 || c.Batch < 1 {
		return errors.New("QUILL_OUTBOX_RETENTION and the cleanup interval and batch must be positive")
	}
	return nil
}

// CoversStream returns an error naming the settings when consumers would
// forget an event (InboxRetention) while the stream s can still redeliver
// it (its MaxAge).
func (c Config) CoversStream(s stream.Config) error {
	if c.InboxRetention < s.MaxAge {
		return fmt.Errorf("QUILL_INBOX_RETENTION %s must be at least QUILL_STREAM_MAX_AGE %s: consumers must remember an event for as long as the stream can redeliver it", c.InboxRetention, s.MaxAge)
	}
	return nil
}

// Cleaner applies the retention horizons.
type Cleaner struct {
	pool *pgxpool.Pool
	// inbox is the consumer package's tables, where every consumer of
	// this database keeps its inbox.
	inbox *consumer.Store
	cfg   Config
	log   zerolog.Logger
}

// New returns a Cleaner over pool. It returns Validate's error when the
// configuration (with defaults applied) does not validate.
func New(pool *pgxpool.Pool, cfg Config, log zerolog.Logger) (*Cleaner, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	inbox, err := consumer.NewStore(pool, "")
	if err != nil {
		return nil, err
	}
	return &Cleaner{pool: pool, inbox: inbox, cfg: cfg, log: log}, nil
}

// Run cleans every Interval until ctx ends, then returns nil. A failed pass
// is logged and retried at the next interval: it never stops Run.
func (c *Cleaner) Run(ctx context.Context) error {
	for {
		if err := c.Clean(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn().Err(err).Str("error_category", "cleanup_failed").Msg("cleanup failed; it runs again later")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.cfg.Interval):
		}
	}
}

// Clean is one pass: it deletes published events past the outbox
// retention, compacts operation records past their response retention to
// tombstones, deletes records past their key retention, and deletes inbox
// rows and the version guard's rows of deleted notes past the inbox
// retention — each in batches of Batch until nothing is
// left or ctx ends. Every horizon is compared with the database's clock
// (now() in the statements), never this host's: several cleaners on hosts
// whose clocks disagree apply the same horizons (decision 0070). It returns
// the first step's failure, wrapped with the step's name.
func (c *Cleaner) Clean(ctx context.Context) error {
	var dbClock time.Time // the zero time: the database's clock
	batch := c.cfg.Batch
	steps := []struct {
		name string
		run  func() (int64, error)
		// whole: run does every batch itself.
		whole bool
	}{
		{"outbox", func() (int64, error) {
			return outbox.DeletePublished(ctx, c.pool, dbClock, c.cfg.OutboxRetention, batch)
		}, true},
		{"compact", func() (int64, error) { return idempotency.Compact(ctx, c.pool, dbClock, batch) }, false},
		{"forget", func() (int64, error) { return idempotency.Forget(ctx, c.pool, dbClock, batch) }, false},
		{"inbox", func() (int64, error) { return c.inbox.DeleteExpiredInbox(ctx, c.cfg.InboxRetention, batch) }, false},
		// The guard's rows share the inbox's horizon: a deleted note's
		// earlier events can come again only while the stream holds them
		// (consumer.Store.DeleteExpiredVersions). The webhook dispatcher
		// keeps the guard on, one row per note it has delivered.
		{"versions", func() (int64, error) { return c.inbox.DeleteExpiredVersions(ctx, c.cfg.InboxRetention, batch) }, false},
	}
	for _, s := range steps {
		total := int64(0)
		for {
			n, err := s.run()
			if err != nil {
				return fmt.Errorf("cleanup %s: %w", s.name, err)
			}
			total += n
			if s.whole || n < int64(batch) || ctx.Err() != nil {
				break
			}
		}
		if total > 0 {
			c.log.Info().Str("step", s.name).Int64("rows", total).Msg("cleanup")
		}
	}
	return nil
}
