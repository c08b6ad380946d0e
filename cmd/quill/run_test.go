package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/buildinfo"
	"github.com/quillhq/quill/internal/faultproxy"
)

// testBundle is a real API (real PostgreSQL) behind a response-dropping
// proxy, and the settings of a quill command aimed at it.
type testBundle struct {
	t        *testing.T
	api      *apitest.API
	proxy    *faultproxy.Proxy
	env      map[string]string
	journal  string
	requests atomic.Int64
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{t: t, api: apitest.Start(t)}
	b.api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.requests.Add(1)
			next.ServeHTTP(w, r)
		})
	})
	var front string
	b.proxy, front = b.api.Proxy(t, faultproxy.Config{})
	home := t.TempDir()
	b.journal = filepath.Join(home, "state", "quill", "journal")
	b.env = map[string]string{"QUILL_URL": front, "QUILL_TOKEN": b.api.Token, "HOME": home,
		"XDG_STATE_HOME": filepath.Join(home, "state")}
	return b
}

// quill runs the program in-process and returns stdout, stderr and the
// exit status.
func (b *testBundle) quill(args ...string) (string, string, int) {
	b.t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(b.t.Context(), args, func(k string) string { return b.env[k] }, strings.NewReader(""), &stdout, &stderr)
	code := exitCode(err, &stderr)
	return stdout.String(), stderr.String(), code
}

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &m), "output: %s", s)
	return m
}

func TestCreateGetListDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	file := filepath.Join(t.TempDir(), "list.txt")
	require.NoError(t, os.WriteFile(file, []byte("milk\neggs\n"), 0o600))

	out, errOut, code := b.quill("notes", "create", "--title", "Groceries", "--body", "b", "--attach", file, "--json")
	require.Equal(t, 0, code, errOut)
	res := decode(t, out)
	require.Equal(t, "completed", res["state"])
	key := res["operation_key"].(string)
	require.NotEmpty(t, key)
	note := res["note"].(map[string]any)
	id := note["id"].(string)
	require.Equal(t, "Groceries", note["title"])
	require.Equal(t, "text/plain; charset=utf-8", note["attachment"].(map[string]any)["content_type"])

	// The journal holds it, settled: moved aside into settled/, where the
	// per-call path does not read (beside it only the lock file).
	ents, err := filepath.Glob(filepath.Join(b.journal, "settled", "*.op"))
	require.NoError(t, err)
	require.Len(t, ents, 1)
	ents, err = filepath.Glob(filepath.Join(b.journal, "*.op"))
	require.NoError(t, err)
	require.Empty(t, ents)
	require.FileExists(t, filepath.Join(b.journal, ".lock"))

	out, _, code = b.quill("notes", "get", id, "--json")
	require.Equal(t, 0, code)
	require.Equal(t, id, decode(t, out)["id"])

	out, _, code = b.quill("notes", "get", id)
	require.Equal(t, 0, code)
	require.Contains(t, out, "title:   Groceries")

	out, _, code = b.quill("notes", "list", "--json", "--limit", "5")
	require.Equal(t, 0, code)
	require.Len(t, decode(t, out)["items"], 1)

	out, _, code = b.quill("ops", "get", key, "--json")
	require.Equal(t, 0, code)
	op := decode(t, out)
	require.Equal(t, "completed", op["state"])
	require.Equal(t, "create-note", op["action"])

	// The human form keeps its columns (kind type id state) with a "-"
	// for what an effect has not: an attachment's type.
	out, _, code = b.quill("ops", "get", key)
	require.Equal(t, 0, code)
	require.Contains(t, out, "operation "+key+": create-note completed")
	require.Regexp(t, `(?m)^effect: event quill\.note\.created\.v1 [0-9a-f-]{36} (pending|published)$`, out)
	require.Regexp(t, `(?m)^effect: attachment - `+note["attachment"].(map[string]any)["id"].(string)+` (pending|processed|failed)$`, out)

	out, _, code = b.quill("ops", "get", "never-used", "--json")
	require.Equal(t, 0, code)
	require.Equal(t, "not_found", decode(t, out)["state"])

	out, errOut, code = b.quill("notes", "delete", id, "--json", "--key", "del-"+id)
	require.Equal(t, 0, code, errOut)
	del := decode(t, out)
	require.Equal(t, "completed", del["state"])
	require.Equal(t, "del-"+id, del["operation_key"])
	require.Equal(t, id, del["note"].(map[string]any)["id"])

	// Reading a deleted note: the server's final answer, exit 3.
	out, _, code = b.quill("notes", "get", id, "--json")
	require.Equal(t, 3, code)
	require.Equal(t, "not_found", decode(t, out)["error"].(map[string]any)["code"])
}

func TestDroppedResponseIsRetriedUnderTheSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.proxy.DropNext(1)
	out, errOut, code := b.quill("notes", "create", "--title", "once", "--key", "cli-drop-1", "--json")
	require.Equal(t, 0, code, errOut)
	res := decode(t, out)
	require.Equal(t, "completed", res["state"])
	require.Equal(t, true, res["replayed"])
	require.Equal(t, 1, b.api.Notes(t, "once"))

	// Human output names the key.
	out, _, code = b.quill("notes", "create", "--title", "twice")
	require.Equal(t, 0, code)
	require.Contains(t, out, "operation key: ")
}

func TestUsageErrorsAreCaughtBeforeAnySend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{
		{"notes", "create"},
		{"notes", "create", "--title", "x", "--key", "has space"},
		{"notes", "create", "--title", "x", "--key", ""},
		{"notes", "create", "--title", strings.Repeat("x", 201)},
		{"notes", "create", "--title", "x", "--attach", "/nonexistent/file"},
		{"notes", "create", "--title", "x", "--attempts", "0"},
		{"notes", "create", "--title", "x", "--deadline", "soon"},
		{"notes", "create", "--title", "x", "--bogus"},
		{"notes", "delete"},
		{"notes", "get"},
		{"ops", "get"},
		{"ops", "get", "a,b"},
		{"ops", "resume", "extra"},
		{"nope"},
		{"notes", "nope"},
	} {
		_, errOut, code := b.quill(args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
	}
	b.env["QUILL_TOKEN"] = ""
	_, errOut, code := b.quill("notes", "create", "--title", "x")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "QUILL_TOKEN")
	require.Zero(t, b.requests.Load())
}

func TestRefusedIsExit3AndNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, _, code := b.quill("notes", "create", "--title", "first", "--key", "k-422")
	require.Equal(t, 0, code)
	before := b.requests.Load()
	out, _, code := b.quill("notes", "create", "--title", "second", "--key", "k-422", "--json")
	require.Equal(t, 3, code)
	res := decode(t, out)
	require.Equal(t, "refused", res["state"])
	require.Equal(t, "k-422", res["operation_key"])
	require.Equal(t, "idempotency_key_reused", res["error"].(map[string]any)["code"])
	// The key was sent before, so its age is checked against the server's
	// key retention, read first (GET /v1/limits).
	require.Equal(t, before+2, b.requests.Load(), "a 422 is sent once")

	_, errOut, code := b.quill("notes", "create", "--title", "second", "--key", "k-422")
	require.Equal(t, 3, code)
	require.Contains(t, errOut, "idempotency_key_reused")
}

func TestUnknownOutcomeThenResumeFinishesWithoutADuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Every answer is lost, lookups included: the process ends without
	// knowing — as if it had died before the answer.
	require.NoError(t, b.proxy.SetDropProbability(1))
	out, errOut, code := b.quill("notes", "create", "--title", "resume me", "--attempts", "2", "--deadline", "3s", "--json")
	require.Equal(t, 4, code, errOut)
	res := decode(t, out)
	require.Equal(t, "unknown", res["state"])
	key := res["operation_key"].(string)
	require.NotEmpty(t, key)
	require.Equal(t, "outcome_unknown", res["error"].(map[string]any)["code"])
	require.Equal(t, 1, b.api.Notes(t, "resume me"), "the API did commit it")

	// Human output prints the key and what to do.
	_, errOut, code = b.quill("notes", "create", "--title", "resume me too", "--attempts", "1", "--deadline", "2s")
	require.Equal(t, 4, code)
	require.Contains(t, errOut, "outcome unknown")
	require.Contains(t, errOut, "quill ops resume")

	// While the network is still down, resume cannot settle them: exit 4.
	out, _, code = b.quill("ops", "resume", "--attempts", "1", "--deadline", "2s", "--json")
	require.Equal(t, 4, code)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2)

	require.NoError(t, b.proxy.SetDropProbability(0))
	out, errOut, code = b.quill("ops", "resume", "--json")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	first := decode(t, lines[0])
	require.Equal(t, key, first["operation_key"], "oldest first, under its original key")
	require.Equal(t, "completed", first["state"])
	require.Equal(t, true, first["replayed"])
	require.Equal(t, "resume me", first["note"].(map[string]any)["title"])
	require.Equal(t, 1, b.api.Notes(t, "resume me"), "no duplicate")
	require.Equal(t, 1, b.api.Notes(t, "resume me too"))

	out, _, code = b.quill("ops", "resume")
	require.Equal(t, 0, code)
	require.Contains(t, out, "nothing to resume")
}

func TestCrashAfterJournallingBeforeSendingIsResumed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The process journals, and the first request never gets out: the
	// API is unreachable, and the process is killed (its context ends).
	b.env["QUILL_URL"] = "http://127.0.0.1:1"
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"notes", "create", "--title", "journalled", "--key", "crash-k", "--json"},
		func(k string) string { return b.env[k] }, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, 4, exitCode(err, &stderr), stderr.String())
	require.Equal(t, 0, b.api.Notes(t, "journalled"))

	b.env["QUILL_URL"] = b.api.URL
	out, errOut, code := b.quill("ops", "resume")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "crash-k create-note completed")
	require.Equal(t, 1, b.api.Notes(t, "journalled"))
}

func TestHungServerIsExit4WithinTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	b.api.Wrap(func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		})
	})
	start := time.Now()
	out, _, code := b.quill("notes", "create", "--title", "hung", "--key", "hung-cli", "--deadline", "2s", "--json")
	require.Equal(t, 4, code)
	require.Less(t, time.Since(start), 3*time.Second)
	res := decode(t, out)
	require.Equal(t, "hung-cli", res["operation_key"])
	require.Equal(t, "unknown", res["state"])
}

func TestJournalDefaults(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	require.Equal(t, "/x/quill/journal", defaultJournal(env(map[string]string{"XDG_STATE_HOME": "/x", "HOME": "/h"})))
	require.Equal(t, "/h/.local/state/quill/journal", defaultJournal(env(map[string]string{"HOME": "/h"})))
	require.Equal(t, "/h/.local/state/quill/journal", defaultJournal(env(map[string]string{"XDG_STATE_HOME": "rel", "HOME": "/h"})))
}

// TestOpsPrune: settled records go once older than --older-than; an
// unsettled operation past the key retention is kept and reported (exit 4)
// until --abandon; prune needs no token; bad durations are usage errors.
func TestOpsPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, errOut, code := b.quill("notes", "create", "--title", "kept for now", "--key", "settled-k")
	require.Equal(t, 0, code, errOut+out)
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	_, err = j.Begin(t.Context(), client.JournalEntry{Key: "lost-k", Action: contract.ActionCreateNote,
		Params: json.RawMessage(`{"title":"t"}`), CreatedAt: time.Now().Add(-40 * 24 * time.Hour)})
	require.NoError(t, err)
	delete(b.env, "QUILL_TOKEN") // prune is local

	out, errOut, code = b.quill("ops", "prune")
	require.Equal(t, 4, code, "an unsettled operation past the key retention is kept: %s %s", out, errOut)
	require.Contains(t, out, "removed 0 settled operations")
	require.Contains(t, out, "kept lost-k create-note")
	_, err = j.Get(t.Context(), "settled-k")
	require.NoError(t, err, "settled a moment ago: kept")

	out, errOut, code = b.quill("ops", "prune", "--older-than", "1ns", "--abandon", "--json")
	require.Equal(t, 0, code, errOut)
	m := decode(t, out)
	require.Equal(t, []any{"settled-k"}, m["removed"])
	require.Equal(t, []any{"lost-k"}, m["abandoned"])
	require.Empty(t, m["expired"])
	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Empty(t, un)

	_, errOut, code = b.quill("ops", "prune", "--older-than", "0s")
	require.Equal(t, 2, code, errOut)
}

// TestVersion runs the real program: --version and version answer one line
// on stdout and exit 0, sending nothing (no server, no token, no journal).
// A subcommand's --version goes where its --help goes: stderr, which keeps
// stdout for results.
func TestVersion(t *testing.T) {
	t.Parallel()
	line := buildinfo.Read().Line("quill") + "\n"
	tests := []struct {
		args           []string
		stdout, stderr string
	}{
		{args: []string{"--version"}, stdout: line},
		{args: []string{"-version"}, stdout: line},
		{args: []string{"version"}, stdout: line},
		{args: []string{"notes", "--version"}, stdout: line},
		{args: []string{"notes", "create", "--version"}, stderr: line},
		{args: []string{"ops", "resume", "--json", "--version"}, stderr: line},
		{args: []string{"mcp", "--version"}, stderr: line},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			getenv := func(k string) string { return map[string]string{"QUILL_URL": "http://127.0.0.1:1"}[k] }
			err := run(t.Context(), tt.args, getenv, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, exitOK, exitCode(err, &stderr), "%v", err)
			require.Equal(t, tt.stdout, stdout.String())
			require.Equal(t, tt.stderr, stderr.String())
		})
	}
}

func TestTokenFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	good := write("good", b.api.Token+"\n", 0o600)
	token := b.env["QUILL_TOKEN"]
	delete(b.env, "QUILL_TOKEN")

	out, errOut, code := b.quill("notes", "create", "--title", "from a token file", "--token-file", good, "--json")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "completed", decode(t, out)["state"])

	b.env["QUILL_TOKEN_FILE"] = write("crlf", b.api.Token+"\r\n", 0o640) // group-readable is allowed
	_, errOut, code = b.quill("notes", "list")
	require.Equal(t, 0, code, errOut)
	delete(b.env, "QUILL_TOKEN_FILE")

	sent := b.requests.Load()
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"missing", []string{"--token-file", filepath.Join(dir, "nope")}, nil, "no such file"},
		{"empty", []string{"--token-file", write("empty", "", 0o600)}, nil, "is empty"},
		{"only a newline", []string{"--token-file", write("nl", "\n", 0o600)}, nil, "is empty"},
		{"two lines", []string{"--token-file", write("two", b.api.Token+"\n"+b.api.Token+"\n", 0o600)}, nil, "one line"},
		{"spaces", []string{"--token-file", write("sp", " "+b.api.Token, 0o600)}, nil, "one line"},
		{"world-readable", []string{"--token-file", write("world", b.api.Token, 0o644)}, nil, "chmod o-rwx"},
		{"unreadable", []string{"--token-file", write("unreadable", b.api.Token, 0o000)}, nil, ""},
		{"a directory", []string{"--token-file", dir}, nil, "not a regular file"},
		{"too large", []string{"--token-file", write("big", strings.Repeat("a", 5000), 0o600)}, nil, "one token"},
		{"both flags", []string{"--token-file", good, "--token", token}, nil, "not both"},
		{"both variables", nil, map[string]string{"QUILL_TOKEN": token, "QUILL_TOKEN_FILE": good}, "not both"},
		{"bad file from the environment", nil, map[string]string{"QUILL_TOKEN_FILE": filepath.Join(dir, "nope")}, "token file"},
	} {
		if tc.name == "unreadable" && os.Geteuid() == 0 {
			continue // root reads any file
		}
		for k, v := range tc.env {
			b.env[k] = v
		}
		args := append([]string{"notes", "create", "--title", "never sent"}, tc.args...)
		out, errOut, code := b.quill(args...)
		require.Equal(t, 2, code, "%s: %s%s", tc.name, out, errOut)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "%s: one line: %q", tc.name, errOut)
		require.Contains(t, errOut, tc.want, tc.name)
		require.NotContains(t, errOut, b.api.Token, "%s: the token is never printed", tc.name)
		for k := range tc.env {
			delete(b.env, k)
		}
	}
	require.Equal(t, sent, b.requests.Load(), "nothing was sent")

	// A flag wins over the other variable.
	b.env["QUILL_TOKEN"] = "qt_00000000_" + strings.Repeat("A", 43)
	_, errOut, code = b.quill("notes", "list", "--token-file", good)
	require.Equal(t, 0, code, errOut)
	b.env["QUILL_TOKEN_FILE"] = filepath.Join(dir, "nope")
	_, errOut, code = b.quill("notes", "list", "--token", token)
	require.Equal(t, 0, code, errOut)

	// --help says why to prefer the file.
	out, errOut, code = b.quill("notes", "create", "--help")
	require.Equal(t, 0, code)
	out += errOut
	require.Contains(t, out, "process list")
	require.Contains(t, out, "--token-file")
}
