package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/dbtest"
)

func TestPrintable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain text, ünïcode and 日本", "plain text, ünïcode and 日本"},
		{"", ""},
		{"\x1b[2J\x1b]0;owned\x07", `\x1b[2J\x1b]0;owned\a`},
		{"two\nlines\r\ttab", `two\nlines\r\ttab`},
		{`back\slash`, `back\\slash`},
		{"invalid \xff\xfe utf-8", `invalid \xff\xfe utf-8`},
		{"c1 \u009b31m csi", `c1 \u009b31m csi`},
		{"bidi \u202e override, zero\u200bwidth", `bidi \u202e override, zero\u200bwidth`},
		{"del \x7f nul \x00", `del \x7f nul \x00`},
	} {
		if got := cli.Printable(tc.in); got != tc.want {
			t.Errorf("cli.Printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A dead letter whose error, subject and event id carry terminal escape
// sequences and line breaks (an event's text ends up in its error) is
// listed on one line with them escaped; --json keeps the exact text.
func TestDeadLettersListEscapes(t *testing.T) {
	t.Parallel()
	pool, dbURL := dbtest.Pool(t, 2)
	hostile := "unparseable event: \x1b[2J\x1b]0;owned\x07\nfake line\r"
	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	require.NoError(t, store.WriteDeadLetter(t.Context(), "w-esc", consumer.DeadLetter{Event: consumer.Event{ID: "ev\x1b[31m",
		Delivery: consumer.Delivery{Subject: "q.t.note.created\x1b[0m", Deliveries: 1}}, Payload: []byte("payload"), Reason: hostile}, time.Now()))

	var out bytes.Buffer
	cli := map[string]string{"DATABASE_URL": dbURL, "QUILL_CONSUMER": "w-esc"}
	require.NoError(t, run(t.Context(), []string{"dead-letters", "list"}, clitest.Env(cli), &out, io.Discard))
	text := out.String()
	require.Equal(t, 1, strings.Count(text, "\n"), text)
	require.NotContains(t, text, "\x1b")
	require.NotContains(t, text, "\r")
	require.Contains(t, text, `error: unparseable event: \x1b[2J\x1b]0;owned\a\nfake line\r`)
	require.Contains(t, text, `event ev\x1b[31m  q.t.note.created\x1b[0m`)

	out.Reset()
	require.NoError(t, run(t.Context(), []string{"dead-letters", "list", "--json"}, clitest.Env(cli), &out, io.Discard))
	var l consumer.StoredDeadLetter
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(out.Bytes()), &l))
	require.Equal(t, hostile, l.Reason)
	require.Equal(t, "ev\x1b[31m", l.EventID)
}

// Every consumer built on the consumer package keeps its dead letters in
// the one table under its own name: --consumer (QUILL_CONSUMER) lists
// only that consumer's, and retries only an id of its own.
func TestDeadLettersOfEachConsumer(t *testing.T) {
	t.Parallel()
	pool, dbURL := dbtest.Pool(t, 2)
	store, err := consumer.NewStore(pool, "")
	require.NoError(t, err)
	for _, name := range []string{"w-one", "w-other"} {
		require.NoError(t, store.WriteDeadLetter(t.Context(), name, consumer.DeadLetter{Event: consumer.Event{ID: "ev-" + name,
			Delivery: consumer.Delivery{Subject: "q.t.note.created", Deliveries: 1}}, Reason: "boom"}, time.Now()))
	}
	others, err := store.DeadLetters(t.Context(), consumer.DeadLetterQuery{Consumer: "w-other"})
	require.NoError(t, err)
	require.Len(t, others, 1)

	var out bytes.Buffer
	env := clitest.Env(map[string]string{"DATABASE_URL": dbURL, "QUILL_CONSUMER": "w-one"})
	require.NoError(t, run(t.Context(), []string{"dead-letters", "list"}, env, &out, io.Discard))
	require.Contains(t, out.String(), "event ev-w-one")
	require.NotContains(t, out.String(), "ev-w-other")
	out.Reset()
	require.NoError(t, run(t.Context(), []string{"dead-letters", "list", "--consumer", "w-other"}, env, &out, io.Discard))
	require.Contains(t, out.String(), "event ev-w-other")
	require.NotContains(t, out.String(), "ev-w-one")

	err = run(t.Context(), []string{"dead-letters", "retry", fmt.Sprint(others[0].ID)}, env, io.Discard, io.Discard)
	var usage cli.UsageError
	require.ErrorAs(t, err, &usage, "another consumer's dead letter is not w-one's to retry")
	require.Contains(t, err.Error(), "no dead letter with this id")
}
