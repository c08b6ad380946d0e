package dispatch_test

import (
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
	"github.com/quillhq/quill/internal/dispatch"
)

// opsWorld is a fresh schema with endpoints and deliveries written as the
// API and the dispatcher leave them, for the operator functions.
type opsWorld struct {
	t    *testing.T
	pool *pgxpool.Pool
}

func newOpsWorld(t *testing.T) opsWorld {
	t.Helper()
	pool, _ := dbtest.Pool(t, 4)
	return opsWorld{t: t, pool: pool}
}

// endpoint inserts an endpoint of tenant; health is "" (never attempted),
// "active" or "disabled"; deleted marks it deleted.
func (w opsWorld) endpoint(tenant, url, health string, deleted bool) uuid.UUID {
	w.t.Helper()
	id := uuid.New()
	_, err := w.pool.Exec(w.t.Context(), `INSERT INTO webhook_endpoints (id, tenant, url, event_types, secret_sealed, deleted_at)
		VALUES ($1, $2, $3, '{note.created}', '\x00', CASE WHEN $4 THEN now() END)`, id, tenant, url, deleted)
	require.NoError(w.t, err)
	switch health {
	case "active":
		_, err = w.pool.Exec(w.t.Context(), `INSERT INTO webhook_endpoint_health (endpoint_id, last_attempt_at, last_status, last_error, failures_in_row, failing_since)
			VALUES ($1, now(), 500, 'answered 500', 3, now() - interval '1 hour')`, id)
	case "disabled":
		_, err = w.pool.Exec(w.t.Context(), `INSERT INTO webhook_endpoint_health (endpoint_id, state, disabled_at, disabled_reason, last_attempt_at, last_status, last_error, failures_in_row, failing_since)
			VALUES ($1, 'disabled', now(), 'answered 410 Gone', now(), 410, 'answered 410 Gone', 7, now() - interval '5 days')`, id)
	}
	require.NoError(w.t, err)
	return id
}

// deliveries inserts n deliveries to endpoint in state and returns their
// ids in insertion order.
func (w opsWorld) deliveries(endpoint uuid.UUID, state string, n int) []int64 {
	w.t.Helper()
	rows, err := w.pool.Query(w.t.Context(), `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, attempts, last_status, last_error, failed_at, delivered_at)
		SELECT e.tenant, e.id, gen_random_uuid(), 'note.created', '{}', now(), $2, 4, 503, 'answered 503',
			CASE WHEN $2 = 'failed' THEN now() END, CASE WHEN $2 = 'delivered' THEN now() END
		FROM webhook_endpoints e, generate_series(1, $3) g WHERE e.id = $1 ORDER BY g RETURNING id`, endpoint, state, n)
	require.NoError(w.t, err)
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(w.t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(w.t, rows.Err())
	require.Len(w.t, ids, n)
	return ids
}

func (w opsWorld) state(id int64) string {
	w.t.Helper()
	var s string
	require.NoError(w.t, w.pool.QueryRow(w.t.Context(), `SELECT state FROM webhook_deliveries WHERE id = $1`, id).Scan(&s))
	return s
}

// TestListFailedPages: the failed deliveries page newest first from a
// cursor, every one exactly once and nothing else; ?endpoint narrows to
// one endpoint's; the limit is bounded.
func TestListFailedPages(t *testing.T) {
	t.Parallel()
	w := newOpsWorld(t)
	ctx := t.Context()
	a := w.endpoint("acme", "https://a.example/hook", "disabled", false)
	b := w.endpoint("beta", "https://b.example/hook", "active", false)
	failedA := w.deliveries(a, "failed", 70)
	failedB := w.deliveries(b, "failed", 35)
	w.deliveries(a, "pending", 5)
	w.deliveries(b, "delivered", 5)

	walk := func(ep *uuid.UUID, limit int) (ids []int64, pages int) {
		var before int64
		for {
			page, err := dispatch.ListFailed(ctx, w.pool, dispatch.FailedQuery{Endpoint: ep, Before: before, Limit: limit})
			require.NoError(t, err)
			if len(page) == 0 {
				return ids, pages
			}
			pages++
			for _, d := range page {
				require.Equal(t, "failed", d.State)
				if ep != nil {
					require.Equal(t, ep.String(), d.EndpointID)
				}
				ids = append(ids, d.ID)
			}
			before = page[len(page)-1].ID
		}
	}
	all, pages := walk(nil, 20)
	require.Equal(t, 6, pages, "105 rows, 20 a page")
	require.Len(t, all, 105)
	for i := 1; i < len(all); i++ {
		require.Greater(t, all[i-1], all[i], "newest first, each once")
	}
	require.ElementsMatch(t, append(append([]int64{}, failedA...), failedB...), all)

	onlyB, _ := walk(&b, 10)
	require.ElementsMatch(t, failedB, onlyB)

	first, err := dispatch.ListFailed(ctx, w.pool, dispatch.FailedQuery{})
	require.NoError(t, err)
	require.Len(t, first, dispatch.DefaultPageLimit)
	require.Equal(t, failedB[len(failedB)-1], first[0].ID)
	require.Equal(t, "beta", first[0].Tenant)
	require.NotNil(t, first[0].LastError)
	require.Equal(t, "answered 503", *first[0].LastError)
	require.Equal(t, 503, *first[0].LastStatus)
	require.NotNil(t, first[0].FailedAt)

	none := uuid.New()
	rows, err := dispatch.ListFailed(ctx, w.pool, dispatch.FailedQuery{Endpoint: &none})
	require.NoError(t, err)
	require.Empty(t, rows, "an endpoint that does not exist has none")
}

// TestGetDeliveryAndEndpoint: one row by id, with its endpoint's health and
// failed count; an unknown id wraps ErrNotFound.
func TestGetDeliveryAndEndpoint(t *testing.T) {
	t.Parallel()
	w := newOpsWorld(t)
	ctx := t.Context()
	dis := w.endpoint("acme", "https://a.example/hook", "disabled", false)
	fresh := w.endpoint("acme", "https://fresh.example/hook", "", false)
	ids := w.deliveries(dis, "failed", 3)
	w.deliveries(dis, "delivered", 2)

	d, err := dispatch.GetDelivery(ctx, w.pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, ids[1], d.ID)
	require.Equal(t, dis.String(), d.EndpointID)
	require.Equal(t, "failed", d.State)
	require.Equal(t, 4, d.Attempts)
	_, err = dispatch.GetDelivery(ctx, w.pool, ids[2]+1000)
	require.ErrorIs(t, err, dispatch.ErrNotFound)

	e, err := dispatch.GetEndpoint(ctx, w.pool, dis)
	require.NoError(t, err)
	require.Equal(t, "https://a.example/hook", e.URL)
	require.Equal(t, "acme", e.Tenant)
	require.Equal(t, "disabled", e.State)
	require.Equal(t, 7, e.FailuresInRow)
	require.NotNil(t, e.DisabledAt)
	require.Equal(t, "answered 410 Gone", *e.DisabledReason)
	require.EqualValues(t, 3, e.Failed, "its failed deliveries only")
	require.Nil(t, e.DeletedAt)

	e, err = dispatch.GetEndpoint(ctx, w.pool, fresh)
	require.NoError(t, err)
	require.Equal(t, "active", e.State, "never attempted: active")
	require.Zero(t, e.FailuresInRow)
	require.Nil(t, e.LastAttemptAt)

	_, err = dispatch.GetEndpoint(ctx, w.pool, uuid.New())
	require.ErrorIs(t, err, dispatch.ErrNotFound)
}

// TestListDisabled: the disabled endpoints that are not deleted, in id
// order from a cursor; active, never-attempted and deleted ones are not
// listed.
func TestListDisabled(t *testing.T) {
	t.Parallel()
	w := newOpsWorld(t)
	ctx := t.Context()
	var want []uuid.UUID
	for range 5 {
		want = append(want, w.endpoint("acme", "https://d.example/", "disabled", false))
	}
	w.endpoint("acme", "https://a.example/", "active", false)
	w.endpoint("acme", "https://n.example/", "", false)
	w.endpoint("acme", "https://gone.example/", "disabled", true)
	w.deliveries(want[0], "failed", 2)

	var got []uuid.UUID
	var after *uuid.UUID
	pages := 0
	for {
		page, err := dispatch.ListDisabled(ctx, w.pool, dispatch.DisabledQuery{After: after, Limit: 2})
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		pages++
		for _, e := range page {
			require.Equal(t, "disabled", e.State)
			require.Nil(t, e.DeletedAt)
			if e.ID == want[0] {
				require.EqualValues(t, 2, e.Failed)
			}
			got = append(got, e.ID)
		}
		last := page[len(page)-1].ID
		after = &last
	}
	require.Equal(t, 3, pages)
	require.ElementsMatch(t, want, got)
	for i := 1; i < len(got); i++ {
		require.Negative(t, compareUUID(got[i-1], got[i]), "id order")
	}
}

func compareUUID(a, b uuid.UUID) int {
	for i := range a {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return 0
}

// TestOperatorActions: Retry, RetryFailed and Enable, the actions the
// commands and the console share — what each refuses and with which error.
func TestOperatorActions(t *testing.T) {
	t.Parallel()
	w := newOpsWorld(t)
	ctx := t.Context()
	active := w.endpoint("acme", "https://a.example/", "active", false)
	disabled := w.endpoint("acme", "https://d.example/", "disabled", false)
	deleted := w.endpoint("acme", "https://x.example/", "", true)
	failedActive := w.deliveries(active, "failed", 3)
	delivered := w.deliveries(active, "delivered", 1)[0]
	pending := w.deliveries(active, "pending", 1)[0]
	failedDisabled := w.deliveries(disabled, "failed", 2)
	failedDeleted := w.deliveries(deleted, "failed", 1)[0]

	refused := func(err error) bool {
		var r *dispatch.RefusedRetryError
		return errors.As(err, &r)
	}
	for _, tc := range []struct {
		name    string
		id      int64
		refused bool
	}{
		{"delivered", delivered, true},
		{"pending", pending, true},
		{"of a disabled endpoint", failedDisabled[0], true},
		{"of a deleted endpoint", failedDeleted, true},
	} {
		err := dispatch.Retry(ctx, w.pool, tc.id)
		require.True(t, refused(err), "%s: %v", tc.name, err)
	}
	require.ErrorIs(t, dispatch.Retry(ctx, w.pool, failedDeleted+1000), dispatch.ErrNotFound)

	require.NoError(t, dispatch.Retry(ctx, w.pool, failedActive[0]))
	require.Equal(t, "pending", w.state(failedActive[0]))
	require.True(t, refused(dispatch.Retry(ctx, w.pool, failedActive[0])), "pending now: not failed")

	n, skipped, err := dispatch.RetryFailed(ctx, w.pool, &disabled)
	require.NoError(t, err)
	require.Zero(t, n, "a disabled endpoint's stay failed")
	require.EqualValues(t, 2, skipped)

	_, err = dispatch.Enable(ctx, w.pool, uuid.New())
	require.ErrorIs(t, err, dispatch.ErrNotFound)
	_, err = dispatch.Enable(ctx, w.pool, deleted)
	require.True(t, refused(err), "a deleted endpoint cannot be enabled")
	failed, err := dispatch.Enable(ctx, w.pool, disabled)
	require.NoError(t, err)
	require.EqualValues(t, 2, failed)
	e, err := dispatch.GetEndpoint(ctx, w.pool, disabled)
	require.NoError(t, err)
	require.Equal(t, "active", e.State)
	require.Zero(t, e.FailuresInRow)

	n, skipped, err = dispatch.RetryFailed(ctx, w.pool, &disabled)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Zero(t, skipped)
	for _, id := range failedDisabled {
		require.Equal(t, "pending", w.state(id))
	}
	require.Equal(t, "failed", w.state(failedActive[1]), "another endpoint's untouched")
}
