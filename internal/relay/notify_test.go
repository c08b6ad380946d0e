package relay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/relay"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/testkit"
)

// isolatedDatabase creates and migrates a database of t's own and returns
// its URL: NOTIFY is per database, and in the shared test database every
// other test's notifications would wake a relay and hide whether its own
// did.
func isolatedDatabase(t *testing.T) string {
	t.Helper()
	u := dbtest.Database(t)
	_, err := dbtest.Migrate(t.Context(), u)
	require.NoError(t, err)
	return u
}

// waitRelayIdle waits until the relay whose sessions carry application_name
// id has gone to sleep for its poll interval: it has LISTENed for quiet (it
// wakes itself once LISTENing and claims at once), and its claim session's
// latest statement is the empty one the claimer sends while it sleeps
// (every third of the lease), not a claim.
func waitRelayIdle(t *testing.T, pool *pgxpool.Pool, id string, quiet time.Duration) {
	t.Helper()
	const sql = `SELECT
		coalesce((SELECT max(query_start) < now() - $2::interval FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN %'), false),
		EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND query = ';' AND state = 'idle')
		AND NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND query LIKE '%pg_try_advisory_lock(%')`
	testkit.WaitFor(t, waitLong, func() bool {
		var listened, asleep bool
		require.NoError(t, pool.QueryRow(t.Context(), sql, id, quiet.String()).Scan(&listened, &asleep))
		return listened && asleep
	}, "relay "+id+" to LISTEN and sleep")
}

// hourlyRelay is a relay that polls once an hour, on a database of its own,
// with a pool for the test beside it.
type hourlyRelay struct {
	id, suffix string
	dbURL      string
	pool       *pgxpool.Pool // the test's, application_name "test-<suffix>"
	js         jetstream.JetStream
	cfg        relay.Config
}

// startHourlyRelay starts a relay that polls once an hour and backs off up
// to maxBackoff, named name-<suffix>, on a migrated database of t's own.
func startHourlyRelay(t *testing.T, name string, maxBackoff time.Duration) *hourlyRelay {
	t.Helper()
	ctx := t.Context()
	h := &hourlyRelay{suffix: testkit.UniqueSuffix(), dbURL: isolatedDatabase(t)}
	h.id = name + "-" + h.suffix
	var err error
	h.pool, err = db.Open(ctx, dbtest.WithParam(t, h.dbURL, "application_name", "test-"+h.suffix), 4)
	require.NoError(t, err)
	t.Cleanup(h.pool.Close)
	relayPool, err := db.Open(ctx, dbtest.WithParam(t, h.dbURL, "application_name", h.id), 4)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)
	srv := natstest.Start(t)
	var nc *nats.Conn
	nc, h.js = srv.Connect(t, relay.ConnOptions()...)
	h.cfg = relay.Config{Stream: stream.Config{Name: "HOURLY_" + strings.ToUpper(h.suffix), SubjectPrefix: "q" + h.suffix,
		DuplicateWindow: 2 * time.Hour, MaxAge: 3 * time.Hour}, PollInterval: time.Hour,
		Lease: time.Second, AckTimeout: time.Second, MaxBackoff: maxBackoff, Batch: 64}
	r, err := relay.New(relayPool, nc, h.cfg, testkit.Logger(t), metrics.NewRelay(prometheus.NewRegistry()), relay.WithID(h.id))
	require.NoError(t, err)
	require.NoError(t, r.Provision(ctx))
	start(t, r)
	return h
}

// TestNotifyWakesAnIdleRelay: a relay that polls once an hour, started and
// asleep, publishes an event within seconds of a commit made the way the API
// makes it (notes.Service, then its outbox.Notifier) — the notification woke
// it. The control: an event committed without a notification stays
// unpublished meanwhile, so it is not the poll (nor a leftover wake-up) that
// publishes; the notified pass takes it along.
func TestNotifyWakesAnIdleRelay(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	h := startHourlyRelay(t, "relay-notify", 250*time.Millisecond)
	id, suffix, writer, js, cfg := h.id, h.suffix, h.pool, h.js, h.cfg
	tenant := "acme-" + suffix
	waitRelayIdle(t, writer, id, time.Second)

	publishedAt := func(eventID uuid.UUID) bool {
		var published bool
		require.NoError(t, writer.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM outbox_events WHERE id = $1`,
			eventID).Scan(&published))
		return published
	}

	// The control: committed, not notified.
	silentNote := uuid.New()
	silent := outbox.Event{ID: uuid.Must(uuid.NewV7()), Tenant: tenant, AggregateID: silentNote,
		Type: contract.EventNoteCreated, Time: time.Now(), Data: eventData(silentNote, contract.EventNoteCreated)}
	require.NoError(t, db.WithTx(ctx, writer, func(tx pgx.Tx) error { return outbox.Insert(ctx, tx, silent) }))
	// Not a wait: for a second, the event must stay unpublished.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		require.False(t, publishedAt(silent.ID), "an event committed without a notification waits for the hour-long poll")
	}
	require.Empty(t, natstest.StreamMessages(t, js, cfg.Stream.Name, ""))

	// The API's way: the service commits and signals the notifier, whose
	// NOTIFY wakes the relay.
	var notifyErrs struct {
		sync.Mutex
		errs []error
	}
	notifier := outbox.NewNotifier(writer, func(err error) {
		notifyErrs.Lock()
		notifyErrs.errs = append(notifyErrs.errs, err)
		notifyErrs.Unlock()
	})
	nctx, stopNotifier := context.WithCancel(context.Background())
	notifierDone := make(chan error, 1)
	go func() { notifierDone <- notifier.Run(nctx) }()
	t.Cleanup(func() {
		stopNotifier()
		require.NoError(t, <-notifierDone)
	})
	svc, err := notes.NewService(writer, notes.Config{}, zerolog.Nop(), notes.WithNotifier(notifier))
	require.NoError(t, err)
	out, err := svc.Create(ctx, notes.Request{Tenant: tenant, Key: "notify-" + suffix, Wait: -1, Render: httpapi.RenderWrite},
		notes.CreateParams{Title: "wakes the relay"})
	require.NoError(t, err)
	require.Equal(t, notes.OutcomeCreated, out.Outcome)
	var created uuid.UUID
	require.NoError(t, writer.QueryRow(ctx, `SELECT id FROM outbox_events WHERE id <> $1`, silent.ID).Scan(&created))

	testkit.WaitFor(t, 15*time.Second, func() bool { return publishedAt(created) && publishedAt(silent.ID) },
		"the notified event, and the one committed before it, published long before the hour-long poll")
	inStream := map[string]string{}
	for _, m := range streamMessages(t, js, cfg.Stream.Name) {
		inStream[m.Header.Get(jetstream.MsgIDHeader)] = m.Subject
	}
	subject := contract.Subject(cfg.Stream.SubjectPrefix, tenant, contract.EventNoteCreated)
	require.Equal(t, map[string]string{created.String(): subject, silent.ID.String(): subject}, inStream)
	notifyErrs.Lock()
	defer notifyErrs.Unlock()
	require.Empty(t, notifyErrs.errs, "the notifier's NOTIFY failed")
}

// TestListenReconnectsPromptly: a relay whose LISTEN connection is lost
// again and again listens again each time within its first backoff step —
// the backoff starts over after every connection that listened — rather
// than after a wait that doubles with every loss over the process's life
// (up to Config.MaxBackoff, here a minute).
func TestListenReconnectsPromptly(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	h := startHourlyRelay(t, "relay-relisten", time.Minute)
	id, admin := h.id, h.pool

	listener := func() (pid int32) {
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`,
			id).Scan(&pid)
		if err != nil {
			return 0
		}
		return pid
	}
	testkit.WaitFor(t, waitLong, func() bool { return listener() != 0 }, "the relay to LISTEN")
	// Without the reset, the 12th loss waits up to 100 ms × 2^11 (capped
	// at a minute): the 12 losses would take about a minute in all.
	began := time.Now()
	for i := range 12 {
		pid := listener()
		var killed bool
		require.NoError(t, admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
		require.True(t, killed, "loss %d", i+1)
		testkit.WaitFor(t, waitLong, func() bool { p := listener(); return p != 0 && p != pid }, "the relay to LISTEN again")
	}
	require.Less(t, time.Since(began), 10*time.Second, "12 lost LISTEN connections cost the relay %s", time.Since(began))
}

// TestIdleRelayKeepsItsClaimSession: the claim session's idle timeout is the
// lease, yet a working relay asleep for longer — here an hour's poll, with a
// one-second lease — keeps its session: the claimer touches it while it
// sleeps.
func TestIdleRelayKeepsItsClaimSession(t *testing.T) {
	t.Parallel()
	h := startHourlyRelay(t, "relay-idle", 250*time.Millisecond)
	waitRelayIdle(t, h.pool, h.id, time.Second)
	session := func() (pid int32) {
		err := h.pool.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND (query = ';' OR query LIKE '%pg_try_advisory_lock(%')`, h.id).Scan(&pid)
		if err != nil {
			return 0
		}
		return pid
	}
	before := session()
	require.NotZero(t, before)
	time.Sleep(4 * h.cfg.Lease) // the idleness under test, not a wait
	require.Equal(t, before, session(), "the claim session outlived four leases of sleep")
}
