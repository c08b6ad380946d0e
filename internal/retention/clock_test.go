package retention_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/retention"
	"github.com/quillhq/quill/internal/testkit"
)

// TestExpiryFollowsTheDatabaseClock: the host that runs the cleanup has a
// clock that disagrees with the database's — here the database's is made
// 1000 hours ahead of it (its schema's now() shadows pg_catalog's), then
// 1000 hours behind — and every horizon is still applied by the
// database's clock: what is past it by that clock goes, what is not
// stays. (Run is the production path; it cleans at once.)
func TestExpiryFollowsTheDatabaseClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []string{"1000 hours", "-1000 hours"} {
		t.Run(skew, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			u := dbtest.Schema(t)
			parsed, err := url.Parse(u)
			require.NoError(t, err)
			schema := parsed.Query().Get("search_path")
			conn, err := pgx.Connect(ctx, u)
			require.NoError(t, err)
			_, err = conn.Exec(ctx, `CREATE FUNCTION `+pgx.Identifier{schema}.Sanitize()+`.now() RETURNS timestamptz
				LANGUAGE sql STABLE AS $$ SELECT pg_catalog.now() + interval '`+skew+`' $$`)
			require.NoError(t, err)
			require.NoError(t, conn.Close(ctx))
			// Named after the schema, pg_catalog is searched after it.
			pool, err := db.Open(ctx, dbtest.WithParam(t, u, "search_path", schema+",pg_catalog"), 4)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			var dbNow time.Time
			require.NoError(t, pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow))
			require.Greater(t, time.Until(dbNow).Abs(), 900*time.Hour, "the database's clock is skewed")

			tenant := "acme-" + testkit.UniqueSuffix()
			write := func(ago string) uuid.UUID {
				e := outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: tenant, AggregateID: uuid.New(), Type: contract.EventNoteCreated,
					Time: time.Now(), Data: map[string]any{}}
				require.NoError(t, db.WithTx(ctx, pool, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, e) }))
				_, err := pool.Exec(ctx, `UPDATE outbox_events SET published_at = now() - $2::interval, stream_seq = seq,
					created_at = now() - $2::interval - interval '1 second' WHERE id = $1`, e.ID, ago)
				require.NoError(t, err)
				return e.ID
			}
			oldEvent, youngEvent := write("169 hours"), write("167 hours")

			svc, err := notes.NewService(pool, notes.Config{}, zerolog.Nop())
			require.NoError(t, err)
			for _, key := range []string{"forgotten", "compacted", "fresh"} {
				_, err := svc.Create(ctx, notes.Request{Tenant: tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite}, notes.CreateParams{Title: key})
				require.NoError(t, err)
			}
			// Stamped by the database's clock, as an API host whose clock
			// agrees with the database's would stamp them.
			_, err = pool.Exec(ctx, `UPDATE operations SET expires_at = now() - interval '1 hour', forget_at = now() - interval '1 minute' WHERE key = 'forgotten'`)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `UPDATE operations SET expires_at = now() - interval '1 hour', forget_at = now() + interval '1 hour' WHERE key = 'compacted'`)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `UPDATE operations SET expires_at = now() + interval '1 hour', forget_at = now() + interval '2 hours' WHERE key = 'fresh'`)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `INSERT INTO quill_consumer_inbox (consumer, event_id, event_type, stream_seq, deliveries, processed_at) VALUES ('w', $1, '', 0, 1, now() - interval '337 hours'), ('w', $2, '', 0, 1, now() - interval '335 hours')`,
				uuid.New(), uuid.New())
			require.NoError(t, err)

			c, err := retention.New(pool, retention.Config{Batch: 2, Interval: time.Hour}, zerolog.Nop())
			require.NoError(t, err)
			count := func(sql string, args ...any) int {
				var n int
				require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
				return n
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(rctx) }()
			testkit.WaitFor(t, waitLong, func() bool { return count(`SELECT count(*) FROM quill_consumer_inbox`) == 1 }, "the pass to reach the inbox")
			cancel()
			testkit.RequireReturned(t, done, waitLong)

			require.Zero(t, count(`SELECT count(*) FROM outbox_events WHERE id = $1`, oldEvent), "published 169h ago by the database's clock: deleted")
			require.Equal(t, 1, count(`SELECT count(*) FROM outbox_events WHERE id = $1`, youngEvent), "published 167h ago: kept")
			require.Zero(t, count(`SELECT count(*) FROM operations WHERE key = 'forgotten'`))
			require.Equal(t, 1, count(`SELECT count(*) FROM operations WHERE key = 'compacted' AND response_body IS NULL AND compacted_at IS NOT NULL`))
			require.Equal(t, 1, count(`SELECT count(*) FROM operations WHERE key = 'fresh' AND response_body IS NOT NULL AND compacted_at IS NULL`))
			require.Equal(t, 1, count(`SELECT count(*) FROM quill_consumer_inbox WHERE processed_at > now() - interval '336 hours'`), "the younger inbox row is kept")
		})
	}
}
