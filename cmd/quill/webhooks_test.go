package main

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/faultproxy"
)

// requireNotInJournal fails the test if s is in any file of the journal.
func (b *testBundle) requireNotInJournal(s string) {
	t := b.t
	t.Helper()
	require.NoError(t, filepath.WalkDir(b.journal, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NotContains(t, string(raw), s, "journal file %s", p)
		return nil
	}))
}

// An endpoint's life through quill webhooks: the secret printed by create
// and rotate-secret only, each time with the line saying it will not be
// shown again, never in the journal; reads show the endpoint and its
// health; a deleted endpoint is not_found (exit 3).
func TestWebhooksCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, errOut, code := b.quill("webhooks", "create", "https://hooks.example.com/q",
		"--event-type", "note.created", "--event-type", "quill.note.deleted.v1,note.created", "--description", "ci", "--key", "wh-create", "--json")
	require.Equal(t, 0, code, errOut)
	res := decode(t, out)
	require.Equal(t, "completed", res["state"])
	require.Equal(t, "wh-create", res["operation_key"])
	secret := res["secret"].(string)
	require.True(t, strings.HasPrefix(secret, "whsec_"), secret)
	hook := res["webhook"].(map[string]any)
	id := hook["id"].(string)
	require.Equal(t, []any{"quill.note.created.v1", "quill.note.deleted.v1"}, hook["event_types"])
	require.Contains(t, errOut, "will not be shown again")
	b.requireNotInJournal(secret)

	// The same key again: the same endpoint and secret, replayed.
	out, errOut, code = b.quill("webhooks", "create", "https://hooks.example.com/q",
		"--event-type", "note.created,note.deleted", "--description", "ci", "--key", "wh-create")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "created (replayed: an earlier delivery had executed it) webhook endpoint "+id)
	require.Contains(t, out, "secret: "+secret+"\n")
	require.Contains(t, out, "operation key: wh-create")
	require.Contains(t, errOut, "will not be shown again")

	out, errOut, code = b.quill("webhooks", "list", "--json")
	require.Equal(t, 0, code, errOut)
	items := decode(t, out)["items"].([]any)
	require.Len(t, items, 1)
	require.NotContains(t, out, "whsec_")
	out, _, code = b.quill("webhooks", "list")
	require.Equal(t, 0, code)
	require.Regexp(t, `^`+id+`  active    https://hooks.example.com/q  quill.note.created.v1,quill.note.deleted.v1  no delivery attempted\n$`, out)

	out, errOut, code = b.quill("webhooks", "get", strings.ToUpper(id))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "id:          "+id+"\n")
	require.Contains(t, out, "state:       active\n")
	require.Contains(t, out, "description: ci\n")
	require.NotContains(t, out, "whsec_")
	out, _, code = b.quill("webhooks", "get", id, "--json")
	require.Equal(t, 0, code)
	require.EqualValues(t, 0, decode(t, out)["health"].(map[string]any)["failures_in_row"])

	out, errOut, code = b.quill("webhooks", "rotate-secret", id, "--key", "wh-rotate")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^rotated the secret of webhook endpoint `+id+`; the previous one signs beside it until \S+Z$`, out)
	require.Regexp(t, `(?m)^secret: whsec_\S+$`, out)
	require.NotContains(t, out, secret)
	require.Contains(t, errOut, "will not be shown again")
	rotated := strings.TrimPrefix(regexpLine(t, out, "secret: "), "secret: ")
	b.requireNotInJournal(rotated)

	// A note's lookup shows the deliveries of its event (here the
	// dispatcher's row, written as it would).
	_, _, code = b.quill("notes", "create", "--title", "hooked", "--key", "wh-note")
	require.Equal(t, 0, code)
	_, err := b.api.Pool.Exec(t.Context(), `INSERT INTO webhook_deliveries (tenant, endpoint_id, event_id, event_type, payload, event_time, state, attempts, last_status)
		SELECT tenant, $2, id, 'quill.note.created.v1', '{}', now(), 'delivered', 1, 204 FROM outbox_events WHERE tenant = $1 AND operation_key = 'wh-note'`,
		b.api.Tenant, id)
	require.NoError(t, err)
	out, _, code = b.quill("ops", "get", "wh-note")
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^effect: webhook - [0-9a-f-]{36} delivered endpoint=`+id+` attempts=1 last_status=204$`, out)
	out, _, code = b.quill("ops", "get", "wh-note", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"kind":"webhook"`)

	out, errOut, code = b.quill("webhooks", "delete", id, "--key", "wh-delete", "--json")
	require.Equal(t, 0, code, errOut)
	del := decode(t, out)
	require.Equal(t, "completed", del["state"])
	require.Equal(t, id, del["webhook"].(map[string]any)["id"])

	out, _, code = b.quill("webhooks", "get", id, "--json")
	require.Equal(t, 3, code)
	require.Equal(t, "not_found", decode(t, out)["error"].(map[string]any)["code"])
	out, errOut, code = b.quill("webhooks", "rotate-secret", id)
	require.Equal(t, 3, code, out)
	require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	require.Contains(t, errOut, "quill: refused: ")
	require.Contains(t, errOut, "not_found")
	out, _, code = b.quill("webhooks", "list")
	require.Equal(t, 0, code)
	require.Equal(t, "no webhook endpoints\n", out)

	// A URL the server refuses: exit 3, the field named.
	out, _, code = b.quill("webhooks", "create", "http://10.0.0.1/x", "--event-type", "note.created", "--json")
	require.Equal(t, 3, code)
	require.Equal(t, "validation_failed", decode(t, out)["error"].(map[string]any)["code"])
}

func regexpLine(t *testing.T, out, prefix string) string {
	t.Helper()
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSuffix(l, "\n")
		}
	}
	t.Fatalf("no line starting %q in %q", prefix, out)
	return ""
}

// Every mistake in a webhooks command line is exit 2, one line, before
// anything is journalled or sent.
func TestWebhooksUsageErrorsAreCaughtBeforeAnySend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"webhooks", "create", "--event-type", "note.created"}, "usage: quill webhooks create URL"},
		{[]string{"webhooks", "create", "https://x.example"}, "--event-type is required"},
		{[]string{"webhooks", "create", "https://x.example", "--event-type", "note.moved"}, `--event-type "note.moved" is not one of`},
		{[]string{"webhooks", "create", "https://x.example", "--event-type", "note.created,"}, `--event-type "" is not one of`},
		{[]string{"webhooks", "create", "https://x.example", "--event-type", "note.created", "--key", "has space"}, "--key"},
		{[]string{"webhooks", "create", "https://x.example", "--event-type", "note.created", "extra"}, "usage: quill webhooks create URL"},
		{[]string{"webhooks", "get"}, "usage: quill webhooks get ID"},
		{[]string{"webhooks", "get", "nope"}, "not a webhook endpoint id"},
		{[]string{"webhooks", "delete", "nope"}, "not a webhook endpoint id"},
		{[]string{"webhooks", "delete", anID, anID}, "usage: quill webhooks delete ID"},
		{[]string{"webhooks", "rotate-secret"}, "usage: quill webhooks rotate-secret ID"},
		{[]string{"webhooks", "rotate-secret", "../notes"}, "not a webhook endpoint id"},
		{[]string{"webhooks", "list", "x"}, `unexpected argument "x"`},
	} {
		out, errOut, code := b.quill(tc.args...)
		require.Equal(t, 2, code, "%v: %s%s", tc.args, out, errOut)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "%v: one line: %q", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
	_, errOut, code := b.quill("webhooks", "nope")
	require.Equal(t, 2, code, errOut)
	require.Zero(t, b.requests.Load())
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Empty(t, un, "nothing was journalled")
}

// A create whose answers all got lost although it executed: exit 4 with
// the line that says how to receive the secret; quill ops resume then
// prints it (once, with the notice), and the endpoint exists once.
func TestWebhookCreateWithoutItsSecretIsFinishedByResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, front := b.api.Proxy(t, faultproxy.Config{Eligible: func(r *http.Request) bool {
		return r.Method == http.MethodPost && r.URL.Path == contract.WebhooksPath
	}})
	b.env["QUILL_URL"] = front
	require.NoError(t, proxy.SetDropProbability(1))
	out, errOut, code := b.quill("webhooks", "create", "https://hooks.example.com/q", "--event-type", "note.created",
		"--key", "wh-lost", "--attempts", "2")
	require.Equal(t, 4, code, out+errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, `it was executed, but its secret has not been received: run "quill ops resume"`)
	require.NotContains(t, errOut, "whsec_")

	out, _, code = b.quill("webhooks", "create", "https://hooks.example.com/q", "--event-type", "note.created",
		"--key", "wh-lost-json", "--attempts", "2", "--json")
	require.Equal(t, 4, code)
	res := decode(t, out)
	require.Equal(t, "unknown", res["state"])
	require.Equal(t, "secret_not_received", res["error"].(map[string]any)["code"])
	require.Equal(t, "completed", res["error"].(map[string]any)["lookup"])

	require.NoError(t, proxy.SetDropProbability(0))
	out, errOut, code = b.quill("ops", "resume")
	require.Equal(t, 0, code, out+errOut)
	require.Regexp(t, `(?m)^wh-lost create-webhook completed: webhook endpoint [0-9a-f-]{36} https://hooks.example.com/q; secret: whsec_\S+$`, out)
	require.Equal(t, 1, strings.Count(errOut, "will not be shown again"), errOut)
	out, _, code = b.quill("webhooks", "list", "--json")
	require.Equal(t, 0, code)
	require.Len(t, decode(t, out)["items"], 2, "one endpoint per key")
}
