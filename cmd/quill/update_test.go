package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
)

const anID = "0193aaaa-0000-7000-8000-000000000001"

// Every mistake in an update's command line is exit 2, one line, before
// anything is journalled or sent.
func TestUpdateUsageErrorsAreCaughtBeforeAnySend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"notes", "update", anID, "--title", "t"}, "--if-version is required"},
		{[]string{"notes", "update", anID, "--if-version", "1"}, "nothing to update"},
		{[]string{"notes", "update", anID, "--if-version", "0", "--title", "t"}, "not a version"},
		{[]string{"notes", "update", anID, "--if-version", "-1", "--title", "t"}, "not a version"},
		{[]string{"notes", "update", anID, "--if-version", "01", "--title", "t"}, "not a version"},
		{[]string{"notes", "update", anID, "--if-version", "x", "--title", "t"}, "not a version"},
		{[]string{"notes", "update", anID, "--if-version", "2147483648", "--title", "t"}, "not a version"},
		{[]string{"notes", "update", anID, "--if-version", "1", "--title", ""}, "--title must not be empty"},
		{[]string{"notes", "update", anID, "--if-version", "1", "--title", strings.Repeat("x", 201)}, "longer than 200"},
		{[]string{"notes", "update", "not-an-id", "--if-version", "1", "--title", "t"}, "not a note id"},
		{[]string{"notes", "update", "--if-version", "1", "--title", "t"}, "usage: quill notes update ID"},
		{[]string{"notes", "update", anID, anID, "--if-version", "1", "--title", "t"}, "usage: quill notes update ID"},
		{[]string{"notes", "update", anID, "--if-version", "1", "--title", "t", "--key", "has space"}, "--key"},
		{[]string{"notes", "delete", anID, "--if-version", "0"}, "not a version"},
	} {
		out, errOut, code := b.quill(tc.args...)
		require.Equal(t, 2, code, "%v: %s%s", tc.args, out, errOut)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "%v: one line: %q", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
	require.Zero(t, b.requests.Load())
	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	un, err := j.Unsettled(t.Context())
	require.NoError(t, err)
	require.Empty(t, un, "nothing was journalled")
}

// An update is journalled, key and parameters, before its first send: a
// process killed before any request got out leaves it for ops resume.
func TestUpdateIsJournalledBeforeItsFirstSend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env["QUILL_URL"] = "http://127.0.0.1:1"
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var stdout, stderr bytes.Buffer
	upper := strings.ToUpper(anID) // an id in another spelling is sent as the canonical one
	err := run(ctx, []string{"notes", "update", upper, "--if-version", "3", "--body", "", "--key", "upd-crash-k", "--json"},
		func(k string) string { return b.env[k] }, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, 4, exitCode(err, &stderr), stderr.String())
	res := decode(t, stdout.String())
	require.Equal(t, "upd-crash-k", res["operation_key"])
	require.Equal(t, "unknown", res["state"])

	j, err := client.OpenFileJournal(b.journal)
	require.NoError(t, err)
	e, err := j.Get(t.Context(), "upd-crash-k")
	require.NoError(t, err)
	require.Equal(t, contract.ActionUpdateNote, e.Action)
	require.JSONEq(t, `{"id":"`+anID+`","if_version":3,"body":""}`, string(e.Params))
	require.Nil(t, e.Settled)
	require.Zero(t, b.requests.Load())
}

// quill notes update end to end against the real API: the next version;
// a stale --if-version is exit 3 with one line naming the current version
// (and with --json the problem's current_version); the same --key after
// the note changed replays the recorded answer; an update left unknown is
// finished by ops resume.
func TestNotesUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out, errOut, code := b.quill("notes", "create", "--title", "draft", "--body", "one", "--json")
	require.Equal(t, 0, code, errOut)
	note := decode(t, out)["note"].(map[string]any)
	id := note["id"].(string)
	require.EqualValues(t, 1, note["version"])

	out, errOut, code = b.quill("notes", "update", id, "--if-version", "1", "--title", "final", "--key", "cli-upd-1", "--json")
	require.Equal(t, 0, code, errOut)
	res := decode(t, out)
	require.Equal(t, "completed", res["state"])
	require.Equal(t, "cli-upd-1", res["operation_key"])
	note = res["note"].(map[string]any)
	require.EqualValues(t, 2, note["version"])
	require.Equal(t, "final", note["title"])
	require.Equal(t, "one", note["body"])

	out, _, code = b.quill("notes", "get", id)
	require.Equal(t, 0, code)
	require.Contains(t, out, "version: 2")

	// Human output of an update names the version and the key.
	out, errOut, code = b.quill("notes", "update", id, "--if-version", "2", "--body", "two")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "updated note "+id+" to version 3")
	require.Contains(t, out, "operation key: ")

	// Stale: exit 3, one line naming the current version, sent once.
	before := b.requests.Load()
	out, errOut, code = b.quill("notes", "update", id, "--if-version", "1", "--body", "theirs", "--key", "cli-stale")
	require.Equal(t, 3, code, out+errOut)
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	require.Contains(t, errOut, "refused: precondition_failed: the note is at version 3")
	require.Contains(t, errOut, "quill notes get "+id)
	require.Equal(t, before+1, b.requests.Load(), "a 412 is final: sent once")

	out, _, code = b.quill("notes", "update", id, "--if-version", "1", "--body", "theirs", "--json")
	require.Equal(t, 3, code)
	res = decode(t, out)
	require.Equal(t, "refused", res["state"])
	perr := res["error"].(map[string]any)
	require.Equal(t, "precondition_failed", perr["code"])
	require.Equal(t, "no", perr["retry"])
	require.EqualValues(t, 3, perr["current_version"])

	// The first update's key again, after the note changed: its recorded
	// 200, not a 412.
	out, errOut, code = b.quill("notes", "update", id, "--if-version", "1", "--title", "final", "--key", "cli-upd-1", "--json")
	require.Equal(t, 0, code, errOut)
	res = decode(t, out)
	require.Equal(t, true, res["replayed"])
	require.EqualValues(t, 2, res["note"].(map[string]any)["version"])

	// An update whose answers are lost ends unknown; ops resume finishes
	// it under its key.
	require.NoError(t, b.proxy.SetDropProbability(1))
	out, errOut, code = b.quill("notes", "update", id, "--if-version", "3", "--title", "resumed", "--key", "cli-upd-lost",
		"--attempts", "1", "--deadline", "2s", "--json")
	require.Equal(t, 4, code, errOut)
	require.Equal(t, "unknown", decode(t, out)["state"])
	require.NoError(t, b.proxy.SetDropProbability(0))
	out, errOut, code = b.quill("ops", "resume", "--json")
	require.Equal(t, 0, code, errOut)
	line := decode(t, strings.TrimSpace(out))
	require.Equal(t, "cli-upd-lost", line["operation_key"])
	require.Equal(t, "update-note", line["action"])
	require.Equal(t, "completed", line["state"])
	require.EqualValues(t, 4, line["note"].(map[string]any)["version"])

	// A delete under a stale --if-version is refused the same way.
	_, errOut, code = b.quill("notes", "delete", id, "--if-version", "3")
	require.Equal(t, 3, code)
	require.Contains(t, errOut, "the note is at version 4")
	out, errOut, code = b.quill("notes", "delete", id, "--if-version", "4", "--json")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "completed", decode(t, out)["state"])

	var m map[string]any
	out, _, _ = b.quill("ops", "get", "cli-upd-1", "--json")
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	require.Equal(t, "update-note", m["action"])
}
