package notes_test

import (
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/notes"
)

// SPEC §11: the lookup lists each webhook delivery of the operation's
// events as an effect, with its state, attempts and last status; another
// tenant's delivery of an event with the same id is not listed.
func TestLookupListsWebhookDeliveries(t *testing.T) {
	t.Parallel()
	b := setupLookup(t)
	b.create(t, "hooked", notes.CreateParams{Title: "delivered to two endpoints"})
	var eventID uuid.UUID
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT id FROM outbox_events WHERE tenant = $1 AND operation_key = 'hooked'`, b.tenant).Scan(&eventID))
	a, c, other := uuid.New(), uuid.New(), uuid.New()
	for _, ep := range []struct {
		id     uuid.UUID
		tenant string
	}{{a, b.tenant}, {c, b.tenant}, {other, "someone-else"}} {
		_, err := b.pool.Exec(t.Context(), `INSERT INTO webhook_endpoints (id, tenant, url, event_types, secret_sealed) VALUES ($1, $2, 'https://example.com', '{quill.note.created.v1}', '\x00')`,
			ep.id, ep.tenant)
		require.NoError(t, err)
	}
	ins := `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, attempts, last_status)
		VALUES ($1, $2, $3, 'quill.note.created.v1', '{}', now(), $4, $5, $6)`
	_, err := b.pool.Exec(t.Context(), ins, b.tenant, a, eventID, "delivered", 2, 200)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), ins, b.tenant, c, eventID, "pending", 0, nil)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), ins, "someone-else", other, eventID, "failed", 9, 500)
	require.NoError(t, err)

	var hooks []notes.Effect
	for _, e := range b.lookup(t, "hooked").Effects {
		if e.Kind == notes.EffectWebhook {
			hooks = append(hooks, e)
		}
	}
	status := 200
	require.Equal(t, []notes.Effect{
		{Kind: notes.EffectWebhook, EndpointID: a.String(), EventID: eventID.String(), State: "delivered", Attempts: 2, LastStatus: &status},
		{Kind: notes.EffectWebhook, EndpointID: c.String(), EventID: eventID.String(), State: "pending"},
	}, hooks)
	got, err := json.Marshal(hooks[1])
	require.NoError(t, err)
	require.JSONEq(t, `{"kind":"webhook","endpoint_id":"`+c.String()+`","event_id":"`+eventID.String()+`","state":"pending","attempts":0,"last_status":null}`, string(got))
}
