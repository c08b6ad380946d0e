package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/clitest"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
)

// tailTimeout bounds one run of the tail in a test: every run here ends by
// --count or by cancelling, far sooner.
const tailTimeout = 20 * time.Second

// tailBundle is a real JetStream server with Quill's stream provisioned as
// the relay provisions it, and the settings of quill events tail for it.
type tailBundle struct {
	t   *testing.T
	srv *natstest.Server
	js  jetstream.JetStream
	cfg stream.Config
	env map[string]string
}

func setupTail(t *testing.T) *tailBundle {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	cfg := stream.Config{Name: "TAIL_EVENTS", SubjectPrefix: "qtail"}.WithDefaults()
	_, err := stream.Provision(t.Context(), js, cfg)
	require.NoError(t, err)
	return &tailBundle{t: t, srv: srv, js: js, cfg: cfg, env: map[string]string{
		"NATS_URL": srv.URL(), "QUILL_STREAM": cfg.Name, "QUILL_SUBJECT_PREFIX": cfg.SubjectPrefix,
	}}
}

// published is one event as the relay published it.
type published struct {
	event outbox.Event
	body  []byte
	seq   uint64
}

// publish publishes an event of typ for tenant the way the relay does: the
// outbox's CloudEvent envelope, Nats-Msg-Id = the event id, Content-Type.
func (b *tailBundle) publish(tenant, typ string, data any) published {
	b.t.Helper()
	ev := outbox.Event{ID: uuid.New(), Tenant: tenant, AggregateID: uuid.New(), Type: typ, Time: time.Now(), Data: data}
	body, err := outbox.Envelope(ev)
	require.NoError(b.t, err)
	msg := nats.NewMsg(contract.Subject(b.cfg.SubjectPrefix, tenant, typ))
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, ev.ID.String())
	msg.Header.Set("Content-Type", "application/cloudevents+json")
	ack, err := b.js.PublishMsg(b.t.Context(), msg)
	require.NoError(b.t, err)
	return published{event: ev, body: body, seq: ack.Sequence}
}

// publishRaw publishes body on tenant's note.created subject, as no relay
// would.
func (b *tailBundle) publishRaw(tenant string, body []byte) uint64 {
	b.t.Helper()
	ack, err := b.js.Publish(b.t.Context(), contract.Subject(b.cfg.SubjectPrefix, tenant, contract.EventNoteCreated), body)
	require.NoError(b.t, err)
	return ack.Sequence
}

func noteCreated(title, body string) map[string]any {
	return map[string]any{"id": uuid.NewString(), "title": title, "body": body,
		"created_at": time.Now().UTC().Format(outbox.TimeFormat), "attachment": nil}
}

// tail runs quill events tail in-process until it ends and returns stdout,
// stderr and the exit status.
func (b *tailBundle) tail(args ...string) (string, string, int) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.t.Context(), tailTimeout)
	defer cancel()
	return runTail(ctx, b.env, args...)
}

func runTail(ctx context.Context, env map[string]string, args ...string) (string, string, int) {
	var stdout, stderr clitest.SyncBuffer
	err := run(ctx, append([]string{"events", "tail"}, args...), func(k string) string { return env[k] },
		strings.NewReader(""), &stdout, &stderr)
	code := exitCode(err, &stderr)
	return stdout.String(), stderr.String(), code
}

// running is a tail running in the background.
type running struct {
	stdout, stderr clitest.SyncBuffer
	cancel         context.CancelFunc
	done           chan int // the exit status
}

// start runs the tail in the background and returns once its consumer
// exists on the server, so that an event published after start is new to
// it.
func (b *tailBundle) start(args ...string) *running {
	b.t.Helper()
	before := b.consumers()
	ctx, cancel := context.WithTimeout(b.t.Context(), tailTimeout)
	r := &running{cancel: cancel, done: make(chan int, 1)}
	go func() {
		err := run(ctx, append([]string{"events", "tail"}, args...), func(k string) string { return b.env[k] },
			strings.NewReader(""), &r.stdout, &r.stderr)
		r.done <- exitCode(err, &r.stderr)
	}()
	b.t.Cleanup(func() { cancel(); <-r.done })
	require.Eventually(b.t, func() bool { return b.consumers() > before },
		10*time.Second, 10*time.Millisecond, "the tail's consumer appears; stderr: %s", r.stderr.String())
	return r
}

// wait returns the tail's exit status once it has ended.
func (r *running) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-r.done:
		r.done <- code // for the cleanup
		return code
	case <-time.After(tailTimeout):
		t.Fatalf("the tail did not end; stdout: %s", r.stdout.String())
		return -1
	}
}

// consumers is the number of consumers of the stream on the server.
func (b *tailBundle) consumers() int {
	b.t.Helper()
	st, err := b.js.Stream(b.t.Context(), b.cfg.Name)
	require.NoError(b.t, err)
	return st.CachedInfo().State.Consumers
}

func lines(s string) []string {
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// requireHumanLine checks that line shows of a published event: its
// stream sequence, type, note, event id and time.
func requireHumanLine(t *testing.T, line string, p published) {
	t.Helper()
	require.Contains(t, line, p.event.Time.UTC().Format(outbox.TimeFormat)+"  ", line)
	require.Contains(t, line, fmt.Sprintf("  seq %d  %s  note %s  event %s  ", p.seq, contract.CloudEventType(p.event.Type),
		p.event.AggregateID, p.event.ID), line)
}

func TestTailPrintsOnlyTheTenantsEvents(t *testing.T) {
	t.Parallel()
	b := setupTail(t)
	// The tenants' events interleave: a tail that let the other tenant's
	// through would print one of them among its first three lines.
	a1 := b.publish("acme", contract.EventNoteCreated, noteCreated("Groceries", "milk"))
	b.publish("globex", contract.EventNoteCreated, noteCreated("Other tenant", ""))
	a2 := b.publish("acme", contract.EventNoteDeleted, map[string]any{"id": uuid.NewString(), "deleted_at": "2026-12-01T10:00:00.000000Z"})
	b.publish("globex", contract.EventNoteDeleted, map[string]any{"id": uuid.NewString(), "deleted_at": "2026-12-01T10:00:00.000000Z"})
	b.publish("acme-2", contract.EventNoteCreated, noteCreated("A tenant whose name starts like acme", ""))
	a3 := b.publish("acme", contract.EventAttachmentProcessed, map[string]any{"note_id": uuid.NewString(),
		"attachment_id": uuid.NewString(), "state": "failed", "reason": "sha256 mismatch"})

	out, errOut, code := b.tail("--tenant", "acme", "--from-seq", "1", "--count", "3")
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	got := lines(out)
	require.Len(t, got, 3, out)
	requireHumanLine(t, got[0], a1)
	require.True(t, strings.HasSuffix(got[0], `  title "Groceries"  body 4 chars`), got[0])
	requireHumanLine(t, got[1], a2)
	require.True(t, strings.HasSuffix(got[1], "  deleted at 2026-12-01T10:00:00.000000Z"), got[1])
	requireHumanLine(t, got[2], a3)
	require.True(t, strings.HasSuffix(got[2], "  attachment failed: sha256 mismatch"), got[2])

	t.Run("json prints the exact bodies", func(t *testing.T) {
		out, errOut, code := b.tail("--tenant", "acme", "--from-seq", "1", "--count", "3", "--json")
		require.Equal(t, 0, code, errOut)
		require.Equal(t, string(a1.body)+"\n"+string(a2.body)+"\n"+string(a3.body)+"\n", out)
	})
	for _, typ := range []string{"note.deleted", "quill.note.deleted.v1"} {
		t.Run("type "+typ, func(t *testing.T) {
			out, errOut, code := b.tail("--tenant", "acme", "--type", typ, "--from-seq", "1", "--count", "1", "--json")
			require.Equal(t, 0, code, errOut)
			require.Equal(t, string(a2.body)+"\n", out, "the tenant's first note.deleted, not its first event")
		})
	}
}

func TestTailStartPoints(t *testing.T) {
	t.Parallel()
	b := setupTail(t)
	var evs []published
	for i := range 5 {
		evs = append(evs, b.publish("acme", contract.EventNoteCreated, noteCreated(fmt.Sprint("note ", i), "")))
	}
	msgs := natstest.StreamMessages(t, b.js, b.cfg.Name, "")
	require.Len(t, msgs, 5)
	fourth := msgs[3].Time
	require.True(t, msgs[2].Time.Before(fourth), "the stream's clock tells the third and fourth apart")

	tests := []struct {
		name string
		args []string
		want []published
	}{
		{name: "from a sequence", args: []string{"--from-seq", "3", "--count", "2"}, want: evs[2:4]},
		{name: "since a time in UTC", args: []string{"--since", fourth.UTC().Format(time.RFC3339Nano), "--count", "2"}, want: evs[3:5]},
		{name: "since a time with an offset", args: []string{"--since", fourth.In(time.FixedZone("", 2*3600)).Format(time.RFC3339Nano), "--count", "1"}, want: evs[3:4]},
		{name: "since a duration back", args: []string{"--since", "1h", "--count", "2"}, want: evs[0:2]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, errOut, code := b.tail(append([]string{"--tenant", "acme", "--json"}, tt.args...)...)
			require.Equal(t, 0, code, errOut)
			want := ""
			for _, p := range tt.want {
				want += string(p.body) + "\n"
			}
			require.Equal(t, want, out)
		})
	}
}

func TestTailFromNowLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	b := setupTail(t)
	b.publish("acme", contract.EventNoteCreated, noteCreated("old", ""))
	r := b.start("--tenant", "acme", "--count", "1", "--json")
	b.publish("globex", contract.EventNoteCreated, noteCreated("other tenant", ""))
	p := b.publish("acme", contract.EventNoteCreated, noteCreated("new", ""))
	require.Equal(t, 0, r.wait(t), r.stderr.String())
	require.Equal(t, string(p.body)+"\n", r.stdout.String(), "by default only events published after the start")
	require.Equal(t, 0, b.consumers(), "the ordered consumer is deleted at exit")
}

func TestTailStopsCleanlyWhenInterrupted(t *testing.T) {
	t.Parallel()
	b := setupTail(t)
	r := b.start("--tenant", "acme")
	p := b.publish("acme", contract.EventNoteCreated, noteCreated("seen", ""))
	require.Eventually(t, func() bool { return strings.Contains(r.stdout.String(), p.event.ID.String()) },
		10*time.Second, 10*time.Millisecond)
	r.cancel() // what main does on SIGINT or SIGTERM
	require.Equal(t, 0, r.wait(t))
	require.Empty(t, r.stderr.String())
	require.Equal(t, 0, b.consumers(), "the ordered consumer is deleted at exit")
}

func TestTailResumesAfterAnOutage(t *testing.T) {
	t.Parallel()
	b := setupTail(t)
	r := b.start("--tenant", "acme", "--count", "3", "--json")
	first := b.publish("acme", contract.EventNoteCreated, noteCreated("before", ""))
	require.Eventually(t, func() bool { return r.stdout.String() == string(first.body)+"\n" },
		10*time.Second, 10*time.Millisecond)
	b.srv.Stop()
	require.Eventually(t, func() bool { return strings.Contains(r.stderr.String(), "quill: NATS connection lost") },
		10*time.Second, 10*time.Millisecond)
	b.srv.Restart(t)
	// Published while the tail is still reconnecting, and after.
	during := b.publish("acme", contract.EventNoteCreated, noteCreated("during", ""))
	require.Eventually(t, func() bool { return strings.Contains(r.stderr.String(), "quill: NATS connection restored") },
		10*time.Second, 10*time.Millisecond)
	after := b.publish("acme", contract.EventNoteCreated, noteCreated("after", ""))
	require.Equal(t, 0, r.wait(t), r.stderr.String())
	require.Equal(t, string(first.body)+"\n"+string(during.body)+"\n"+string(after.body)+"\n", r.stdout.String(),
		"each event once, none skipped")
}

func TestTailShowsWhatIsNotAnEvent(t *testing.T) {
	t.Parallel()
	b := setupTail(t)
	bad := b.publishRaw("acme", []byte("not json \x1b[2J"))
	notCE := b.publishRaw("acme", []byte(`{"hello":"world"}`))
	p := b.publish("acme", contract.EventNoteCreated, noteCreated("\x1b]0;owned\x07Red \x1b[31malert", "x"))

	out, errOut, code := b.tail("--tenant", "acme", "--from-seq", "1", "--count", "3")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "\x1b", "no escape sequence reaches the terminal")
	got := lines(out)
	require.Len(t, got, 3, out)
	require.Contains(t, got[0], fmt.Sprintf("  seq %d  not JSON (13 bytes on qtail.acme.note.created): \"not json \\x1b[2J\"", bad))
	require.Contains(t, got[1], fmt.Sprintf("  seq %d  not a CloudEvent", notCE))
	requireHumanLine(t, got[2], p)
	require.Contains(t, got[2], `title "\x1b]0;owned\aRed \x1b[31malert"`)

	out, errOut, code = b.tail("--tenant", "acme", "--from-seq", "1", "--count", "3", "--json")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, `{"hello":"world"}`+"\n"+string(p.body)+"\n", out, "stdout holds JSON only")
	require.Equal(t, fmt.Sprintf("quill: seq %d on qtail.acme.note.created: not JSON (13 bytes), not printed: \"not json \\x1b[2J\"\n", bad), errOut)
}

func TestTailBadSettingsExit2(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1: a check made after connecting would
	// exit 5, not 2.
	env := map[string]string{"NATS_URL": "nats://127.0.0.1:1"}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	tests := []struct {
		name string
		args []string // after --tenant acme, unless ownTenant
		want string
		// ownTenant: args carry the tenant, or leave it out.
		ownTenant bool
	}{
		{name: "negative sequence", args: []string{"--from-seq", "-1"}, want: `invalid --from-seq "-1": not a stream sequence`},
		{name: "sequence zero", args: []string{"--from-seq", "0"}, want: "not a stream sequence"},
		{name: "sequence not a number", args: []string{"--from-seq", "abc"}, want: "not a stream sequence"},
		{name: "sequence not an integer", args: []string{"--from-seq", "1.5"}, want: "not a stream sequence"},
		{name: "unparseable time", args: []string{"--since", "yesterday"}, want: `invalid --since "yesterday": not an RFC 3339 time`},
		{name: "bad date", args: []string{"--since", "2026-13-01T00:00:00Z"}, want: "not an RFC 3339 time"},
		{name: "negative duration", args: []string{"--since", "-5m"}, want: "must not be negative"},
		{name: "time in the future", args: []string{"--since", future}, want: "is in the future"},
		{name: "two start points", args: []string{"--from-seq", "1", "--since", "10m"}, want: "--from-seq and --since are two start points"},
		{name: "no tenant", args: []string{}, want: "--tenant is required", ownTenant: true},
		{name: "bad tenant", args: []string{"--tenant", "Acme"}, want: `invalid --tenant "Acme": tenant names`, ownTenant: true},
		{name: "wildcard tenant", args: []string{"--tenant", "*"}, want: `invalid --tenant "*"`, ownTenant: true},
		{name: "unknown type", args: []string{"--type", "note.create"}, want: `invalid --type "note.create": not an event type; one of note.created, note.updated, note.deleted, attachment.processed`},
		{name: "count zero", args: []string{"--count", "0"}, want: `invalid --count "0": not a positive integer`},
		{name: "positional argument", args: []string{"acme"}, want: `unexpected argument "acme"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := tt.args
			if !tt.ownTenant {
				args = append([]string{"--tenant", "acme"}, args...)
			}
			out, errOut, code := runTail(t.Context(), env, args...)
			require.Equal(t, 2, code, errOut)
			require.Empty(t, out)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %s", errOut)
			require.Contains(t, errOut, tt.want)
		})
	}
	t.Run("subject prefix with a wildcard", func(t *testing.T) {
		t.Parallel()
		_, errOut, code := runTail(t.Context(), map[string]string{"NATS_URL": "nats://127.0.0.1:1", "QUILL_SUBJECT_PREFIX": "quill.*"}, "--tenant", "acme")
		require.Equal(t, 2, code, errOut)
		require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
		require.Contains(t, errOut, `invalid QUILL_SUBJECT_PREFIX "quill.*"`)
	})
}

func TestTailFailures(t *testing.T) {
	t.Parallel()
	b := setupTail(t)
	t.Run("missing stream", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"NATS_URL": b.env["NATS_URL"], "QUILL_STREAM": "NO_SUCH_STREAM"}
		out, errOut, code := runTail(t.Context(), env, "--tenant", "acme")
		require.Equal(t, exitFailure, code, errOut)
		require.Empty(t, out)
		require.Equal(t, fmt.Sprintf("quill: stream NO_SUCH_STREAM does not exist on %s (the relay creates it when it starts; QUILL_STREAM names it)\n", b.env["NATS_URL"]), errOut)
	})
	t.Run("NATS unreachable", func(t *testing.T) {
		t.Parallel()
		_, errOut, code := runTail(t.Context(), map[string]string{"NATS_URL": "nats://127.0.0.1:1"}, "--tenant", "acme")
		require.Equal(t, exitFailure, code, errOut)
		require.Equal(t, 1, strings.Count(errOut, "\n"), errOut)
		require.Contains(t, errOut, "quill: connect to NATS at nats://127.0.0.1:1: ")
	})
}

func TestHumanLine(t *testing.T) {
	t.Parallel()
	ce := func(typ, data string) []byte {
		return []byte(`{"specversion":"1.0","id":"e1","source":"/tenants/acme","type":"` + typ +
			`","subject":"n1","time":"2026-12-01T10:00:00.000000Z","datacontenttype":"application/json","data":` + data + `}`)
	}
	const head = "2026-12-01T10:00:00.000000Z  seq 7  "
	long := strings.Repeat("é", tailTitleRunes+5)
	tests := []struct {
		name string
		body []byte
		want string
	}{
		{name: "created with an attachment", body: ce("quill.note.created.v1",
			`{"title":"T","body":"héllo","attachment":{"filename":"secret.pdf","content_type":"application/pdf","size":12,"status":"pending"}}`),
			want: head + `quill.note.created.v1  note n1  event e1  title "T"  body 5 chars  attachment application/pdf 12 bytes pending`},
		{name: "long title is cut", body: ce("quill.note.created.v1", `{"title":"`+long+`","body":""}`),
			want: head + `quill.note.created.v1  note n1  event e1  title "` + strings.Repeat("é", tailTitleRunes) + `…"  body 0 chars`},
		{name: "processed", body: ce("quill.attachment.processed.v1", `{"state":"processed","detected_type":"image/png"}`),
			want: head + `quill.attachment.processed.v1  note n1  event e1  attachment processed as image/png`},
		{name: "a type of the future", body: ce("quill.note.created.v2", `{"a":1}`),
			want: head + `quill.note.created.v2  note n1  event e1  data 7 bytes`},
		{name: "data of the wrong shape", body: ce("quill.note.deleted.v1", `[1]`),
			want: head + `quill.note.deleted.v1  note n1  event e1  data does not have the shape of quill.note.deleted.v1`},
		{name: "created without data", body: []byte(`{"id":"e1","type":"quill.note.created.v1","subject":"n1","time":"2026-12-01T10:00:00.000000Z"}`),
			want: head + `quill.note.created.v1  note n1  event e1  data does not have the shape of quill.note.created.v1`},
		{name: "JSON without id", body: []byte(`{"type":"x"}`),
			want: "ARRIVED  seq 7  not a CloudEvent (no id or type; 12 bytes on s): \"{\\\"type\\\":\\\"x\\\"}\""},
		{name: "id of the wrong type", body: []byte(`{"id":1}`),
			want: "ARRIVED  seq 7  not a CloudEvent (8 bytes on s): \"{\\\"id\\\":1}\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := humanLine("7", "ARRIVED", "s", tt.body)
			require.Equal(t, tt.want, got)
			require.NotContains(t, got, "secret.pdf", "no file name")
		})
	}
}
