package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/notes"
)

// horizons is a real API (real PostgreSQL) run with QUILL_IDEMPOTENCY_RETENTION
// 1h and QUILL_KEY_RETENTION 2h, and the settings of a quill command aimed
// at it.
type horizons struct {
	t      *testing.T
	api    *apitest.API
	env    map[string]string
	jdir   string
	writes atomic.Int64
}

func setupHorizons(t *testing.T) *horizons {
	t.Helper()
	const responseRetention, keyRetention = time.Hour, 2 * time.Hour
	h := &horizons{t: t, api: apitest.StartWith(t, notes.Config{ResponseRetention: responseRetention, KeyRetention: keyRetention, Wait: 2 * time.Second})}
	h.api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				h.writes.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	})
	home := t.TempDir()
	h.jdir = filepath.Join(home, "journal")
	h.env = map[string]string{"QUILL_URL": h.api.URL, "QUILL_TOKEN": h.api.Token, "HOME": home, "QUILL_JOURNAL": h.jdir}
	return h
}

func (h *horizons) quill(args ...string) (string, string, int) {
	h.t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(h.t.Context(), args, func(k string) string { return h.env[k] }, strings.NewReader(""), &stdout, &stderr)
	return stdout.String(), stderr.String(), exitCode(err, &stderr)
}

// journal records an unsettled create-note first sent age ago.
func (h *horizons) journal(key, title string, age time.Duration) {
	h.t.Helper()
	j, err := client.OpenFileJournal(h.jdir)
	require.NoError(h.t, err)
	_, err = j.Begin(h.t.Context(), client.JournalEntry{Key: key, Action: contract.ActionCreateNote,
		Params: json.RawMessage(fmt.Sprintf(`{"title":%q}`, title)), CreatedAt: time.Now().Add(-age).UTC()})
	require.NoError(h.t, err)
}

func (h *horizons) notes(title string) int {
	h.t.Helper()
	return h.api.Notes(h.t, title)
}

// Against a server that forgets keys after 2h, "quill ops resume" does not
// resend a journalled create first sent 3h ago — it would make a second
// note — says why, naming the key, and exits non-zero with the operation
// still unsettled; so does a write repeated under that key.
func TestOpsResumeRefusesAKeyOlderThanTheServersKeyRetention(t *testing.T) {
	t.Parallel()
	h := setupHorizons(t)
	h.journal("late-k", "resumed too late", 3*time.Hour)

	out, errOut, code := h.quill("ops", "resume")
	require.Equal(t, exitUnknown, code, "%s %s", out, errOut)
	require.Contains(t, out, "late-k create-note unknown")
	require.Contains(t, out, `key "late-k"`)
	require.Contains(t, out, "the server's key retention is 2h")

	out, errOut, code = h.quill("ops", "resume", "--json")
	require.Equal(t, exitUnknown, code, errOut)
	line := decode(t, out)
	require.Equal(t, "late-k", line["operation_key"])
	require.Equal(t, "unknown", line["state"])
	require.Equal(t, "key_too_old", line["error"].(map[string]any)["code"])
	require.Contains(t, line["error"].(map[string]any)["detail"], "late-k")

	out, errOut, code = h.quill("notes", "create", "--title", "resumed too late", "--key", "late-k", "--json")
	require.Equal(t, exitFailure, code, "%s %s", out, errOut)
	require.Equal(t, "key_too_old", decode(t, out)["error"].(map[string]any)["code"])

	require.Zero(t, h.notes("resumed too late"), "no note: the key was never resent")
	require.Zero(t, h.writes.Load())
	j, err := client.OpenFileJournal(h.jdir)
	require.NoError(t, err)
	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Len(t, un, 1)
}

// "quill ops prune" takes the server's key retention when it can ask for
// it: a 3h-old unsettled operation is past the server's 2h, though within
// the 720h default. --key-retention (or QUILL_KEY_RETENTION) still decides
// when given; without a token the default applies, and prune says so.
func TestOpsPruneTakesTheServersKeyRetention(t *testing.T) {
	t.Parallel()
	h := setupHorizons(t)
	h.journal("late-k", "t", 3*time.Hour)

	out, errOut, code := h.quill("ops", "prune")
	require.Equal(t, exitUnknown, code, "%s %s", out, errOut)
	require.Contains(t, out, "kept late-k create-note")
	require.Contains(t, out, "past the key retention (2h0m0s)")
	require.Empty(t, errOut)

	out, errOut, code = h.quill("ops", "prune", "--key-retention", "720h")
	require.Equal(t, exitOK, code, "%s %s", out, errOut)
	require.NotContains(t, out, "late-k")

	h.env["QUILL_KEY_RETENTION"] = "4h"
	out, errOut, code = h.quill("ops", "prune")
	require.Equal(t, exitOK, code, "%s %s", out, errOut)
	delete(h.env, "QUILL_KEY_RETENTION")

	delete(h.env, "QUILL_TOKEN")
	out, errOut, code = h.quill("ops", "prune")
	require.Equal(t, exitOK, code, "%s %s", out, errOut)
	require.Contains(t, errOut, "no token is set")
	require.Contains(t, errOut, "720h0m0s")

	// An unreachable server: the default, said on stderr.
	h.env["QUILL_TOKEN"] = "qt_00000000_nope"
	h.env["QUILL_URL"] = "http://127.0.0.1:1"
	out, errOut, code = h.quill("ops", "prune", "--json")
	require.Equal(t, exitOK, code, "%s %s", out, errOut)
	require.Contains(t, errOut, "could not be read")
	require.Empty(t, decode(t, out)["expired"])
}
