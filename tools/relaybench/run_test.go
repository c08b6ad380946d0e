package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/natstest"
)

func TestGenerateSpreadsEventsOverNotes(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	events, err := generate(1000, 200, 200, "bench", at)
	if err != nil {
		t.Fatal(err)
	}
	perNote := map[uuid.UUID]int{}
	ids := map[uuid.UUID]bool{}
	for _, e := range events {
		perNote[e.note]++
		if ids[e.id] {
			t.Fatalf("event id %s twice", e.id)
		}
		ids[e.id] = true
		var ce struct {
			ID, Subject, Time string
		}
		if err := json.Unmarshal(e.payload, &ce); err != nil {
			t.Fatalf("payload: %v", err)
		}
		if ce.ID != e.id.String() || ce.Subject != e.note.String() {
			t.Fatalf("payload id/subject %s/%s, want %s/%s", ce.ID, ce.Subject, e.id, e.note)
		}
		if got, err := ceTime(e.payload); err != nil || !got.Equal(at) {
			t.Fatalf("ceTime = %v, %v; want %v", got, err, at)
		}
	}
	if len(perNote) != 200 {
		t.Fatalf("%d notes, want 200", len(perNote))
	}
	for n, c := range perNote {
		if c != 5 {
			t.Fatalf("note %s has %d events, want 5", n, c)
		}
	}
	if avg := avgPayload(events); avg < 550 || avg > 700 {
		t.Errorf("average payload %v bytes, want about 600", avg)
	}
}

func TestReadAPILogKeepsSuccessfulCreates(t *testing.T) {
	t.Parallel()
	hash := opkey.Hash("bench", "k1")
	lines := []string{
		`{"level":"info","message":"listening"}`,
		`{"level":"info","method":"POST","status":201,"key_hash":"` + hash + `","time":"2026-01-02T03:04:05.5Z","message":"request"}`,
		`{"level":"info","method":"POST","status":201,"key_hash":"` + hash + `","time":"2026-01-02T03:04:06Z","message":"request"}`,
		`{"level":"info","method":"POST","status":409,"key_hash":"other","time":"2026-01-02T03:04:05Z","message":"request"}`,
	}
	path := filepath.Join(t.TempDir(), "api.log")
	if err := os.WriteFile(path, []byte(lines[0]+"\n"+lines[1]+"\n"+lines[2]+"\n"+lines[3]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readAPILog(path)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 1, 2, 3, 4, 5, 500_000_000, time.UTC)
	if len(got) != 1 || !got[hash].Equal(want) {
		t.Fatalf("readAPILog = %v, want only %s at %v (the first answer)", got, hash, want)
	}
}

// The latency summary's assertions are measure's TestSummarize.
func TestParseUnix(t *testing.T) {
	t.Parallel()
	tm, err := parseUnix("1767323045.25")
	if err != nil || tm.UnixMilli() != 1767323045250 {
		t.Fatalf("parseUnix = %v, %v", tm, err)
	}
	if _, err := parseUnix("yesterday"); err == nil {
		t.Fatal("parseUnix accepted a word")
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	env := func(string) string { return "" }
	for _, args := range [][]string{nil, {"nope"}, {"latency"}, {"seed", "--notes", "10", "--count", "5"}, {"wait", "extra"},
		{"stream", "--replicas", "0"}, {"raw", "--replicas", "6"}} {
		var out, errOut bytes.Buffer
		err := run(t.Context(), args, env, &out, &errOut)
		var uerr cli.UsageError
		if !errors.As(err, &uerr) {
			t.Errorf("run %q: err = %v, want a usage error", args, err)
		}
	}
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"--version"}, func(string) string { return "" }, &stdout, &stderr))
	require.True(t, strings.HasPrefix(stdout.String(), "relaybench "), stdout.String())
	require.Empty(t, stderr.String())
}

// TestStreamCreatesThenKeepsSettings: the stream subcommand creates the
// relay's kind of stream and, run again, changes only the replicas (here
// none: one server), keeping what an operator set.
func TestStreamCreatesThenKeepsSettings(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	env := func(string) string { return "" }
	args := []string{"stream", "--nats-url", srv.URL(), "--stream", "RB_T", "--subject-prefix", "rbt", "--timeout", "10s"}
	var out, errOut bytes.Buffer
	require.NoError(t, run(t.Context(), args, env, &out, &errOut), errOut.String())
	var got struct {
		Stream   string `json:"stream"`
		Replicas int    `json:"replicas"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &got), out.String())
	require.Equal(t, "RB_T", got.Stream)
	require.Equal(t, 1, got.Replicas)

	nc, js, err := connect(srv.URL(), "test")
	require.NoError(t, err)
	defer nc.Close()
	s, err := js.Stream(t.Context(), "RB_T")
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	require.Equal(t, []string{"rbt.>"}, cfg.Subjects)
	require.Equal(t, defaultDuplicateWindow, cfg.Duplicates)
	cfg.MaxMsgs = 12345 // an operator's setting
	_, err = js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)

	out.Reset()
	require.NoError(t, run(t.Context(), args, env, &out, &errOut), errOut.String())
	s, err = js.Stream(t.Context(), "RB_T")
	require.NoError(t, err)
	require.EqualValues(t, 12345, s.CachedInfo().Config.MaxMsgs)
}
