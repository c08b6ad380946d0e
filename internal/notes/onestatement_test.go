package notes_test

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/httpapi"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/notes"
)

// statementLog records the SQL of every statement a pool runs, batched or
// not.
type statementLog struct {
	mu   sync.Mutex
	sqls []string
	// trips counts round trips: batches and statements sent alone.
	trips int
}

// takeTrips returns the round trips since the last takeTrips.
func (l *statementLog) takeTrips() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.trips
	l.trips = 0
	return n
}

func (l *statementLog) add(sql string) { l.mu.Lock(); l.sqls = append(l.sqls, sql); l.mu.Unlock() }

// take returns the statements since the last take, transaction control and
// the transaction's lock_timeout left out.
func (l *statementLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.sqls {
		if strings.HasPrefix(s, "BEGIN") || s == "COMMIT" || s == "ROLLBACK" || strings.Contains(s, "set_config('lock_timeout'") {
			continue
		}
		out = append(out, s)
	}
	l.sqls = nil
	return out
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	l.mu.Lock()
	l.trips++
	l.mu.Unlock()
	return ctx
}
func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.mu.Lock()
	l.trips++
	l.mu.Unlock()
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Every write claims its key in one statement (idempotency.ClaimWrite)
// that also writes the record and the effect's rows, each once: a create
// with a new key is that statement alone; a key whose record is forgotten
// takes the same statement, which replaces the record (its first
// generation's note id is taken, so the second generation's makes the
// note); a delete and an update lock the note first (in BEGIN's round
// trip) and update it after, in the claim's.
func TestEveryWriteIsOneClaimStatement(t *testing.T) {
	t.Parallel()
	direct, _ := dbtest.Pool(t, 2)
	log := &statementLog{}
	cfg := direct.Config().Copy()
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c := &clock{t: time.Now().UTC().Truncate(time.Microsecond)}
	svc, err := notes.NewService(pool, notes.Config{ReplayCacheBytes: -1}, zerolog.New(io.Discard), notes.WithClock(c.now))
	require.NoError(t, err)
	tenant := reviewTenant()
	create := func(key, title string) notes.Answer {
		t.Helper()
		out, err := svc.Create(t.Context(), notes.Request{Tenant: tenant, Key: key, Wait: -1, Render: httpapi.RenderWrite},
			notes.CreateParams{Title: title, Attachment: &notes.NewAttachment{Filename: "a.txt", ContentType: "text/plain",
				Data: []byte("hello"), SHA256: "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"}})
		require.NoError(t, err)
		require.Equal(t, notes.OutcomeCreated, out.Outcome)
		return out
	}
	claims := func(stmts []string) int {
		n := 0
		for _, s := range stmts {
			if strings.HasPrefix(s, "WITH lk AS") {
				n++
			}
		}
		return n
	}
	create("warm", "warm") // reads the id secret once
	log.take()
	log.takeTrips()

	create("k", "first")
	stmts := log.take()
	require.Len(t, stmts, 1, "one statement: %q", stmts)
	require.Equal(t, 1, log.takeTrips(), "a create is one round trip")
	require.Equal(t, 1, claims(stmts), stmts[0])
	count := func(table, where string) int {
		var n int
		require.NoError(t, direct.QueryRow(t.Context(), `SELECT count(*) FROM `+table+` WHERE tenant = $1 `+where, tenant).Scan(&n))
		return n
	}
	require.Equal(t, 2, count("notes", ""))
	require.Equal(t, 2, count("attachments", ""))
	require.Equal(t, 2, count("outbox_events", ""))
	require.Equal(t, 1, count("operations", "AND key = 'k'"))

	// Past the key retention the record is still there, forgotten.
	c.advance(idempotency.DefaultKeyRetention + time.Hour)
	out := create("k", "second")
	stmts = log.take()
	require.Len(t, stmts, 2, "the claim statement per generation: %q", stmts)
	require.Equal(t, 2, claims(stmts), "%q", stmts)
	require.Equal(t, 3, count("notes", ""), "the key's next note")
	require.Equal(t, 3, count("outbox_events", ""))
	var resource string
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT resource FROM operations WHERE tenant = $1 AND key = 'k'`, tenant).Scan(&resource))
	require.Equal(t, out.Resource, resource, "the record replaced by the second note's")

	id := strings.TrimPrefix(out.Resource, "/v1/notes/")
	log.take()
	log.takeTrips()
	title := "third"
	upd, err := svc.Update(t.Context(), notes.Request{Tenant: tenant, Key: "u", Wait: -1, IfMatch: 1, Render: httpapi.RenderWrite},
		uuid.MustParse(id), notes.UpdateParams{Title: &title})
	require.NoError(t, err)
	require.Equal(t, notes.OutcomeUpdated, upd.Outcome, "%s", upd.Body)
	stmts = log.take()
	require.Len(t, stmts, 3, "the note's lock, the claim, the update: %q", stmts)
	require.Equal(t, 1, claims(stmts), "%q", stmts)
	require.Equal(t, 2, log.takeTrips(), "BEGIN with the lock, then the claim, the update and COMMIT")

	del, err := svc.Delete(t.Context(), notes.Request{Tenant: tenant, Key: "d", Wait: -1, Render: httpapi.RenderWrite}, uuid.MustParse(id))
	require.NoError(t, err)
	require.Equal(t, notes.OutcomeDeleted, del.Outcome)
	stmts = log.take()
	require.Len(t, stmts, 3, "the note's lock, the claim, the update: %q", stmts)
	require.Equal(t, 1, claims(stmts), "%q", stmts)
	require.Equal(t, 2, log.takeTrips(), "BEGIN with the lock, then the claim, the update and COMMIT")
	require.Equal(t, 5, count("outbox_events", ""))
	require.Equal(t, 1, count("notes", "AND deleted_at IS NOT NULL"))
}
