package db_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

func TestProbeRoute(t *testing.T) {
	t.Parallel()
	direct := dbtest.Schema(t)
	for _, tc := range []struct {
		name string
		url  string
		want db.Route
	}{
		{"PostgreSQL itself", direct, db.RouteDirect},
		{"PgBouncer in session mode", dbtest.PgBouncerWith(t, direct, dbtest.PgBouncerConfig{Mode: "session"}), db.RouteSessionPooler},
		{"PgBouncer in transaction mode", dbtest.PgBouncer(t, direct), db.RouteTransactionPooler},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cc, err := pgx.ParseConfig(tc.url)
			require.NoError(t, err)
			got, err := db.ProbeRoute(t.Context(), cc)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// Behind PgBouncer's pool of one backend the probe's first client waits
// for the backend its second holds, which is as telling as seeing it move.
func TestProbeRouteBlocked(t *testing.T) {
	t.Parallel()
	u := dbtest.PgBouncerWith(t, dbtest.Schema(t), dbtest.PgBouncerConfig{PoolSize: 1})
	cc, err := pgx.ParseConfig(u)
	require.NoError(t, err)
	got, err := db.ProbeRoute(t.Context(), cc)
	require.NoError(t, err)
	require.Equal(t, db.RouteTransactionPooler, got)
}

// Through a transaction pooler the pool connects (no startup parameter
// refused), picks a query mode that leaves no prepared statement behind,
// and applies the session settings inside each transaction: pipelined
// writes and WithTx transactions from many goroutines interleave on few
// backends without a prepared statement going missing or colliding.
func TestOpenThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	direct := dbtest.Schema(t)
	for _, tc := range []struct {
		name string
		url  string
		mode pgx.QueryExecMode
	}{
		{"direct", direct, pgx.QueryExecModeCacheStatement},
		{"pgbouncer", dbtest.PgBouncer(t, direct), pgx.QueryExecModeCacheDescribe},
		{"pgbouncer, mode from the URL", dbtest.WithParam(t, dbtest.PgBouncer(t, direct), "default_query_exec_mode", "exec"), pgx.QueryExecModeExec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, err := db.Open(ctx, tc.url, 8)
			require.NoError(t, err)
			defer pool.Close()
			require.Equal(t, tc.mode, pool.Config().ConnConfig.DefaultQueryExecMode)
			_, err = pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS probe_"+modeName(tc.mode)+" (id int PRIMARY KEY, v text)")
			require.NoError(t, err)
			table := "probe_" + modeName(tc.mode)

			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for i := range 32 {
				wg.Go(func() {
					for j := range 10 {
						id := i*100 + j
						p, err := db.BeginPipeline(ctx, pool)
						if err != nil {
							errs <- err
							return
						}
						p.Batch().Queue("INSERT INTO "+table+" (id, v) VALUES ($1, $2)", id, "x")
						var timeout string
						p.Batch().Queue("SELECT current_setting('idle_in_transaction_session_timeout')").QueryRow(func(r pgx.Row) error { return r.Scan(&timeout) })
						err = p.Commit(ctx)
						p.Release()
						if err != nil {
							errs <- err
							return
						}
						if timeout != "1min" {
							errs <- errors.New("pipeline: idle_in_transaction_session_timeout " + timeout)
							return
						}
						err = db.WithTx(ctx, pool, func(tx pgx.Tx) error {
							if err := tx.QueryRow(ctx, "SELECT current_setting('idle_in_transaction_session_timeout')").Scan(&timeout); err != nil {
								return err
							}
							_, err := tx.Exec(ctx, "UPDATE "+table+" SET v = $2 WHERE id = $1", id, "y")
							return err
						})
						if err != nil {
							errs <- err
							return
						}
						if timeout != "1min" {
							errs <- errors.New("WithTx: idle_in_transaction_session_timeout " + timeout)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE v = 'y'").Scan(&n))
			require.Equal(t, 320, n)
		})
	}
}

// A direct session gets the settings at connect; behind a pooler they are
// each transaction's alone (the backend's session keeps its own, for the
// next client); a timeout the operator gave the session is kept.
func TestSessionSettingsPerTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	direct := dbtest.Schema(t)
	for _, tc := range []struct {
		name, url, inTx, session string
	}{
		{"direct", direct, "1min", "1min"},
		{"pgbouncer", dbtest.PgBouncer(t, direct), "1min", "0"},
		{"the operator's", dbtest.WithParam(t, direct, "idle_in_transaction_session_timeout", "5min"), "5min", "5min"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, err := db.Open(ctx, tc.url, 1)
			require.NoError(t, err)
			defer pool.Close()
			var inTx, session string
			require.NoError(t, db.WithTx(ctx, pool, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&inTx)
			}))
			require.NoError(t, db.WithSnapshot(ctx, pool, func(tx pgx.Tx) error {
				var snap string
				if err := tx.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&snap); err != nil {
					return err
				}
				require.Equal(t, tc.inTx, snap)
				return nil
			}))
			require.NoError(t, pool.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&session))
			require.Equal(t, tc.inTx, inTx)
			require.Equal(t, tc.session, session, "outside a transaction: the session's own value")
		})
	}
}

func modeName(m pgx.QueryExecMode) string {
	return map[pgx.QueryExecMode]string{pgx.QueryExecModeCacheStatement: "cache_statement",
		pgx.QueryExecModeCacheDescribe: "cache_describe", pgx.QueryExecModeExec: "exec"}[m]
}
