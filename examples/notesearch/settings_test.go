package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
)

func TestParse(t *testing.T) {
	t.Parallel()
	none := func(string) string { return "" }
	s, err := parse(nil, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, settings{
		databaseURL: defaultDatabaseURL, natsURL: defaultNATSURL, stream: "QUILL_EVENTS", prefix: "quill",
		durable: defaultDurable, concurrency: 4, orderByNote: true, ackWait: 30 * time.Second,
		shutdownTimeout: 10 * time.Second, inboxRetention: defaultInboxRetention, cleanupInterval: defaultCleanupInterval,
	}, s)

	env := map[string]string{"QUILL_SUBJECT_PREFIX": "qa", "NOTESEARCH_CONCURRENCY": "8", "NOTESEARCH_ORDER_BY_NOTE": "false"}
	s, err = parse([]string{"--concurrency", "2", "--durable", "search-2"}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "qa", s.prefix, "from the environment")
	assert.Equal(t, 2, s.concurrency, "the flag wins")
	assert.Equal(t, "search-2", s.durable)
	assert.False(t, s.orderByNote)
}

// TestParseRefusesBadSettings: each bad setting is one usage error (exit
// 2) naming the setting, before anything connects.
func TestParseRefusesBadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--concurrency", "0"}, "concurrency"},
		{[]string{"--concurrency", "many"}, "concurrency"},
		{[]string{"--order-by-note", "perhaps"}, "order-by-note"},
		{[]string{"--ack-wait", "500ms"}, "ack-wait"},
		{[]string{"--ack-wait", "soon"}, "ack-wait"},
		{[]string{"--shutdown-timeout", "-1s"}, "shutdown-timeout"},
		{[]string{"--inbox-retention", "1m"}, "inbox-retention"},
		{[]string{"--cleanup-interval", "0"}, "cleanup-interval"},
		{[]string{"--subject-prefix", "quill.prod"}, "subject-prefix"},
		{[]string{"--subject-prefix", ""}, "subject-prefix"},
		{[]string{"--database-url", "postgres://u:secret@h:notaport/db"}, "database-url"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"extra"}, "extra"},
	} {
		_, err := parse(tc.args, func(string) string { return "" }, io.Discard)
		var u usageError
		require.True(t, errors.As(err, &u), "%v: %v is a usage error", tc.args, err)
		assert.Contains(t, err.Error(), tc.want, tc.args)
		assert.NotContains(t, err.Error(), "secret", "no password in an error")
		assert.NotContains(t, err.Error(), "\n", "one line")
	}
}

// TestRunFailsAtStartWithoutPostgreSQL: an unreachable database is one
// error, not a usage error, and run returns.
func TestRunFailsAtStartWithoutPostgreSQL(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/notesearch?sslmode=disable&connect_timeout=2"}
	err := run(t.Context(), nil, func(k string) string { return env[k] }, io.Discard, io.Discard)
	require.Error(t, err)
	var u usageError
	assert.False(t, errors.As(err, &u))
	assert.True(t, strings.HasPrefix(err.Error(), "PostgreSQL"), err.Error())
}

// TestRunFailsAtStartWithoutNATS: NATS unreachable at start is one error
// after the tables are in place, and run returns.
func TestRunFailsAtStartWithoutNATS(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": dbtest.EmptySchema(t), "NATS_URL": "nats://127.0.0.1:1"}
	err := run(t.Context(), nil, func(k string) string { return env[k] }, io.Discard, io.Discard)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "NATS at nats://127.0.0.1:1"), err.Error())
}
