package clientsuite_test

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/faultproxy"
)

// hookBundle is a real API behind a response-dropping proxy whose drops
// only the webhook writes' answers can suffer, and a journalled client.
type hookBundle struct {
	api     *apitest.API
	proxy   *faultproxy.Proxy
	c       *client.Client
	journal string
}

func setupHooks(t *testing.T, cfg client.Config) *hookBundle {
	t.Helper()
	b := &hookBundle{api: apitest.Start(t), journal: t.TempDir()}
	var front string
	b.proxy, front = b.api.Proxy(t, faultproxy.Config{Eligible: func(r *http.Request) bool {
		return r.Method != http.MethodGet && strings.HasPrefix(r.URL.Path, contract.WebhooksPath)
	}})
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	cfg.BaseURL, cfg.Token, cfg.Journal = front, b.api.Token, j
	cfg.BaseDelay = 5 * time.Millisecond
	b.c, err = client.New(cfg)
	require.NoError(t, err)
	return b
}

// onDisk fails the test if s is in any file of the journal.
func (b *hookBundle) requireNotOnDisk(t *testing.T, s string) {
	t.Helper()
	files := 0
	require.NoError(t, filepath.WalkDir(b.journal, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NotContains(t, string(raw), s, "journal file %s", p)
		files++
		return nil
	}))
	require.NotZero(t, files, "the journal has records")
}

var hook = client.NewWebhook{URL: "https://hooks.example.com/quill", EventTypes: []string{contract.CloudEventType(contract.EventNoteCreated)}, Description: "ci"}

// The endpoints' whole life through the client: the secret in the
// create's and the rotation's answers only, never in a read nor in the
// journal; a deleted endpoint is not_found.
func TestWebhookEndpointsThroughTheClient(t *testing.T) {
	t.Parallel()
	b := setupHooks(t, client.Config{})
	ctx := t.Context()
	created, err := b.c.CreateWebhook(ctx, hook, client.WithKey("hook-create"))
	require.NoError(t, err)
	require.Equal(t, "hook-create", created.Key)
	require.False(t, created.Replayed)
	require.True(t, strings.HasPrefix(created.Secret, "whsec_"), created.Secret)
	id := created.Webhook.ID
	require.NotEmpty(t, id)
	require.Equal(t, hook.URL, created.Webhook.URL)
	require.Equal(t, client.WebhookActive, created.Webhook.State)

	got, err := b.c.GetWebhook(ctx, id)
	require.NoError(t, err)
	require.Equal(t, hook.EventTypes, got.EventTypes)
	require.Equal(t, "ci", got.Description)
	require.Equal(t, client.WebhookActive, got.State)
	require.Zero(t, got.Health.FailuresInRow)
	require.Nil(t, got.Health.LastAttemptAt)
	list, err := b.c.ListWebhooks(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, id, list[0].ID)

	rotated, err := b.c.RotateWebhookSecret(ctx, id, client.WithKey("hook-rotate"))
	require.NoError(t, err)
	require.Equal(t, id, rotated.ID)
	require.True(t, strings.HasPrefix(rotated.Secret, "whsec_"))
	require.NotEqual(t, created.Secret, rotated.Secret)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), rotated.PreviousSecretExpiresAt, time.Minute)

	// A retry of the rotation under its key replays it: the same new
	// secret, not a third one.
	again, err := b.c.RotateWebhookSecret(ctx, id, client.WithKey("hook-rotate"))
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, rotated.Secret, again.Secret)

	// Settled, and the journal kept the answers without their secrets.
	for _, k := range []string{"hook-create", "hook-rotate"} {
		e, err := b.c.Config().Journal.Get(ctx, k)
		require.NoError(t, err)
		require.NotNil(t, e.Settled, k)
		require.Equal(t, client.StateCompleted, e.Settled.State)
		require.Contains(t, string(e.Settled.Body), `"secret":null`, k)
		require.Contains(t, string(e.Settled.Body), id, k)
	}
	b.requireNotOnDisk(t, created.Secret)
	b.requireNotOnDisk(t, rotated.Secret)
	b.requireNotOnDisk(t, strings.TrimPrefix(rotated.Secret, "whsec_"))

	del, err := b.c.DeleteWebhook(ctx, id, client.WithKey("hook-delete"))
	require.NoError(t, err)
	require.Equal(t, id, del.Deletion.ID)
	_, err = b.c.GetWebhook(ctx, id)
	var p *client.Problem
	require.ErrorAs(t, err, &p)
	require.Equal(t, contract.CodeNotFound, p.Code)
	list, err = b.c.ListWebhooks(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	// Rotating or deleting what is gone is the server's final answer.
	_, err = b.c.RotateWebhookSecret(ctx, id)
	var refused *client.RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, contract.CodeNotFound, refused.Problem.Code)
	_, err = b.c.DeleteWebhook(ctx, id)
	require.ErrorAs(t, err, &refused)
	require.Equal(t, contract.CodeNotFound, refused.Problem.Code)

	// A bad create is refused, with the field named, and not retried.
	_, err = b.c.CreateWebhook(ctx, client.NewWebhook{URL: "ftp://x", EventTypes: []string{contract.CloudEventType(contract.EventNoteCreated)}})
	require.ErrorAs(t, err, &refused)
	require.Equal(t, contract.CodeValidation, refused.Problem.Code)
	require.Equal(t, "url", refused.Problem.Errors[0].Field)
}

// A create whose answer is lost is retried under its key: the replay
// carries the same endpoint and secret, and one endpoint exists.
func TestLostWebhookCreateIsReplayedWithItsSecret(t *testing.T) {
	t.Parallel()
	b := setupHooks(t, client.Config{})
	b.proxy.DropNext(1)
	created, err := b.c.CreateWebhook(t.Context(), hook, client.WithKey("hook-lost-1"))
	require.NoError(t, err)
	require.True(t, created.Replayed)
	require.Equal(t, 2, created.Attempts)
	require.True(t, strings.HasPrefix(created.Secret, "whsec_"))
	list, err := b.c.ListWebhooks(t.Context())
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, created.Webhook.ID, list[0].ID)
}

// Every attempt's answer lost: the lookup says the create completed but
// shows no secret, so one more send in what is left of the deadline
// fetches the replay — the secret — rather than answer without it.
func TestWebhookCreateFoundByTheLookupIsReplayedForItsSecret(t *testing.T) {
	t.Parallel()
	b := setupHooks(t, client.Config{Attempts: 2})
	b.proxy.DropNext(2)
	created, err := b.c.CreateWebhook(t.Context(), hook, client.WithKey("hook-lookup-1"))
	require.NoError(t, err)
	require.True(t, created.Replayed)
	require.Equal(t, 3, created.Attempts)
	require.True(t, strings.HasPrefix(created.Secret, "whsec_"))
	e, err := b.c.Config().Journal.Get(t.Context(), "hook-lookup-1")
	require.NoError(t, err)
	require.NotNil(t, e.Settled)
	b.requireNotOnDisk(t, created.Secret)
}

// When even that send loses its answer, the write is not done: the
// outcome is known (completed) but the secret is not, so it stays
// unsettled, and Resume — a resend under the same key — brings the
// secret; the endpoint exists once.
func TestWebhookSecretNotReceivedIsLeftToResume(t *testing.T) {
	t.Parallel()
	b := setupHooks(t, client.Config{Attempts: 2})
	// Every answer, since the transport itself resends a request with an
	// Idempotency-Key whose reused connection failed.
	require.NoError(t, b.proxy.SetDropProbability(1))
	_, err := b.c.CreateWebhook(t.Context(), hook, client.WithKey("hook-unseen-1"))
	var unknown *client.UnknownOutcomeError
	require.ErrorAs(t, err, &unknown)
	require.ErrorIs(t, err, client.ErrSecretNotReceived)
	require.Equal(t, contract.OperationCompleted, unknown.Lookup)
	require.Equal(t, contract.ActionCreateWebhook, unknown.Action)
	require.Equal(t, "hook-unseen-1", unknown.Key)
	un, err := b.c.Config().Journal.Unsettled(t.Context())
	require.NoError(t, err)
	require.Len(t, un, 1)

	require.NoError(t, b.proxy.SetDropProbability(0))
	res, err := b.c.Resume(t.Context())
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NoError(t, res[0].Err)
	require.NotNil(t, res[0].WebhookCreated)
	require.True(t, res[0].WebhookCreated.Replayed)
	require.True(t, strings.HasPrefix(res[0].WebhookCreated.Secret, "whsec_"))
	list, err := b.c.ListWebhooks(t.Context())
	require.NoError(t, err)
	require.Len(t, list, 1)
	un, err = b.c.Config().Journal.Unsettled(t.Context())
	require.NoError(t, err)
	require.Empty(t, un)
	b.requireNotOnDisk(t, res[0].WebhookCreated.Secret)
}

// Resume finishes every kind of webhook write under its journalled key:
// a rotation and a delete that never reached the server execute once.
func TestResumeFinishesWebhookRotationsAndDeletes(t *testing.T) {
	t.Parallel()
	b := setupHooks(t, client.Config{})
	ctx := t.Context()
	created, err := b.c.CreateWebhook(ctx, hook)
	require.NoError(t, err)
	id := created.Webhook.ID
	j := b.c.Config().Journal
	now := time.Now().UTC()
	_, err = j.Begin(ctx, client.JournalEntry{Key: "resume-rotate", Action: contract.ActionRotateWebhookSecret,
		Params: []byte(`{"id":"` + id + `"}`), CreatedAt: now})
	require.NoError(t, err)
	_, err = j.Begin(ctx, client.JournalEntry{Key: "resume-delete", Action: contract.ActionDeleteWebhook,
		Params: []byte(`{"id":"` + id + `"}`), CreatedAt: now.Add(time.Millisecond)})
	require.NoError(t, err)
	res, err := b.c.Resume(ctx)
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.NoError(t, res[0].Err)
	require.NotNil(t, res[0].WebhookSecretRotated)
	require.NotEqual(t, created.Secret, res[0].WebhookSecretRotated.Secret)
	require.NoError(t, res[1].Err)
	require.Equal(t, id, res[1].WebhookDeleted.Deletion.ID)
	_, err = b.c.GetWebhook(ctx, id)
	require.Error(t, err)
}

// The lookup of a note's create lists the deliveries of its event as
// webhook effects (SPEC §11), decoded with their endpoint, event, state,
// attempts and last status.
func TestLookupDecodesWebhookEffects(t *testing.T) {
	t.Parallel()
	b := setupHooks(t, client.Config{})
	ctx := t.Context()
	created, err := b.c.CreateWebhook(ctx, hook)
	require.NoError(t, err)
	note, err := b.c.CreateNote(ctx, client.NewNote{Title: "delivered"}, client.WithKey("hooked-note"))
	require.NoError(t, err)
	var eventID string
	require.NoError(t, b.api.Pool.QueryRow(ctx, `SELECT id::text FROM outbox_events WHERE tenant = $1 AND operation_key = $2`,
		b.api.Tenant, note.Key).Scan(&eventID))
	// The dispatcher's row, as it records a delivery answered 503 twice.
	_, err = b.api.Pool.Exec(ctx, `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, attempts, last_status)
		VALUES ($1, $2, $3, 'quill.note.created.v1', '{}', now(), 'pending', 2, 503)`, b.api.Tenant, created.Webhook.ID, eventID)
	require.NoError(t, err)

	op, err := b.c.GetOperation(ctx, "hooked-note")
	require.NoError(t, err)
	var hooks []client.Effect
	for _, e := range op.Effects {
		if e.Kind == client.EffectWebhook {
			hooks = append(hooks, e)
		}
	}
	status := 503
	require.Equal(t, []client.Effect{{Kind: client.EffectWebhook, EndpointID: created.Webhook.ID, EventID: eventID,
		State: client.DeliveryPending, Attempts: 2, LastStatus: &status}}, hooks)
}
