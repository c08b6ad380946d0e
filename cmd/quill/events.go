package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/stream"
)

// eventsTailUsage is the synopsis of quill events tail.
const eventsTailUsage = "quill events tail --tenant T [--type TYPE] [--from-seq N | --since T] [--count N] [--json]"

// Bounds of what a human line shows of a message.
const (
	tailTitleRunes   = 60 // of a title
	tailExcerptBytes = 80 // of a body that is not a CloudEvent
)

// tailCleanupTimeout bounds the deletion of the tail's consumer at exit,
// which runs after the command's context is cancelled.
const tailCleanupTimeout = 5 * time.Second

// tailStart is where a tail begins: from now (the zero value), at a stream
// sequence, or at a time.
type tailStart struct {
	seq   uint64
	since time.Time
}

// consumerConfig returns the ordered consumer's configuration for the
// filter and the start point.
func (s tailStart) consumerConfig(filter, prefix string) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		NamePrefix:     prefix,
	}
	switch {
	case s.seq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, s.seq
	case !s.since.IsZero():
		t := s.since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	return cfg
}

// parseFromSeq reads --from-seq: a stream sequence, which starts at 1.
func parseFromSeq(v string) (uint64, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return 0, errors.New("not a stream sequence (a positive integer)")
	}
	return n, nil
}

// parseSince reads --since: an RFC 3339 time not after now, or a
// non-negative duration back from now.
func parseSince(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		if t.After(now) {
			return time.Time{}, errors.New("is in the future")
		}
		return t, nil
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return time.Time{}, errors.New("not an RFC 3339 time (2026-12-01T15:04:05Z) or a duration back from now (10m, 2h)")
	case d < 0:
		return time.Time{}, errors.New("must not be negative: a duration counts back from now")
	}
	return now.Add(-d), nil
}

// parseEventType reads --type: an event type as subjects name it
// (note.created) or as the CloudEvents type does (quill.note.created.v1).
func parseEventType(v string) (string, error) {
	t := strings.TrimSuffix(strings.TrimPrefix(v, "quill."), ".v1")
	if slices.Contains(contract.EventTypes(), t) {
		return t, nil
	}
	return "", fmt.Errorf("not an event type; one of %s", strings.Join(contract.EventTypes(), ", "))
}

// checkSubjectPrefix refuses a subject prefix that could not be the first
// tokens of a subject: the filter built from it would match other subjects,
// or none.
func checkSubjectPrefix(p string) error {
	for _, tok := range strings.Split(p, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("invalid QUILL_SUBJECT_PREFIX %q: subject tokens without wildcards or spaces", p)
		}
	}
	return nil
}

// eventsTail is quill events tail: it follows one tenant's events on the
// stream and prints one line each, until the context ends (SIGINT or
// SIGTERM: exit 0) or --count messages were printed. Bad settings are a
// cli.UsageError, caught before connecting; NATS that cannot be reached
// or a stream that does not exist are errors (exit 5).
func (e *env) eventsTail(ctx context.Context, args []string) error {
	var (
		natsCfg             natsconn.Settings
		streamCfg           stream.Config
		tenant, typ         string
		start               tailStart
		fromSeqSet, sinceOK bool
		count               int
		asJSON              bool
	)
	now := time.Now()
	s := e.set("quill events tail", eventsTailUsage)
	natsCfg.Define(s, "NATS with JetStream, the stream's server")
	streamCfg.DefineSubjects(s)
	s.Func("tenant", "", "", "the tenant whose events to follow (required)", func(v string) error {
		if v != "" && !contract.ValidTenant(v) {
			return errors.New("tenant names are 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit")
		}
		tenant = v
		return nil
	})
	s.Func("type", "", "", "only events of this type: "+strings.Join(contract.EventTypes(), ", ")+"; unset: every type", func(v string) error {
		if v == "" {
			return nil
		}
		t, err := parseEventType(v)
		typ = t
		return err
	})
	s.Func("from-seq", "", "", "start at this stream sequence; unset (and no --since): only new events", func(v string) error {
		if v == "" {
			return nil
		}
		n, err := parseFromSeq(v)
		start.seq, fromSeqSet = n, true
		return err
	})
	s.Func("since", "", "", "start at this time: RFC 3339, or a duration back from now such as 10m", func(v string) error {
		if v == "" {
			return nil
		}
		t, err := parseSince(v, now)
		start.since, sinceOK = t, true
		return err
	})
	s.Func("count", "", "", "stop after this many messages; unset: follow until interrupted", func(v string) error {
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errors.New("not a positive integer")
		}
		count = n
		return nil
	})
	s.FlagSet().BoolVar(&asJSON, "json", false, "print each message's body, the CloudEvent's JSON, one per line")
	if err := parseNone(s, args); err != nil {
		return err
	}
	switch {
	case tenant == "":
		return cli.UsageError{Msg: "--tenant is required"}
	case fromSeqSet && sinceOK:
		return cli.UsageError{Msg: "--from-seq and --since are two start points: pass one (default: only new events)"}
	}
	if err := checkSubjectPrefix(streamCfg.SubjectPrefix); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	if err := natsCfg.Validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	filter := contract.TenantSubjects(streamCfg.SubjectPrefix, tenant)
	if typ != "" {
		filter = contract.Subject(streamCfg.SubjectPrefix, tenant, typ)
	}
	t := &tail{out: e.stdout, errOut: &lockedWriter{w: e.stderr}, json: asJSON, count: count}
	return t.run(ctx, natsCfg, streamCfg.Name, start.consumerConfig(filter, consumerPrefix()))
}

// consumerPrefix names the tail's consumers on the server, so an operator
// who lists them sees what they are; the random part keeps two tails from
// sharing one.
func consumerPrefix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return "quill-events-tail-" + hex.EncodeToString(b)
}

// tail prints the messages of one ordered consumer.
type tail struct {
	out    io.Writer
	errOut *lockedWriter // nats.go's handlers write to it from their goroutines
	json   bool
	count  int // 0: no limit
}

// run connects, finds the stream and prints its messages through an
// ordered consumer until ctx ends or t.count messages were printed; then it
// deletes the consumer, so the tail leaves nothing on the server.
func (t *tail) run(ctx context.Context, natsCfg natsconn.Settings, streamName string, cfg jetstream.OrderedConsumerConfig) error {
	// A tail follows for as long as a person watches: it reconnects
	// forever and says so, rather than ending after nats.go's default
	// 60 attempts with a consumer that retries a closed connection.
	nc, err := natsCfg.Connect(nats.Name("quill-events-tail"), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				t.errOut.println("quill: NATS connection lost (" + err.Error() + "); reconnecting")
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { t.errOut.println("quill: NATS connection restored") }))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", natsCfg.Servers(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	st, err := js.Stream(ctx, streamName)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("stream %s does not exist on %s (the relay creates it when it starts; QUILL_STREAM names it)", streamName, natsCfg.Servers())
	case errors.Is(err, jetstream.ErrInvalidStreamName):
		return cli.UsageError{Msg: fmt.Sprintf("invalid QUILL_STREAM %q: %v", streamName, err)}
	case ctx.Err() != nil:
		return nil // interrupted while looking
	case err != nil:
		return fmt.Errorf("stream %s: %w", streamName, err)
	}
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("stream %s: create a consumer: %w", streamName, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("stream %s: consume: %w", streamName, err)
	}
	defer func() {
		it.Stop()
		// The ordered consumer is ephemeral (it would go after 5 minutes
		// of inactivity); deleting it at once leaves no state behind.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tailCleanupTimeout)
			_ = js.DeleteConsumer(dctx, streamName, info.Name)
			cancel()
		}
	}()
	for n := 0; t.count == 0 || n < t.count; n++ {
		msg, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("stream %s: next message: %w", streamName, err)
		}
		if err := t.print(msg); err != nil {
			return fmt.Errorf("print: %w", err)
		}
	}
	return nil
}

// print writes one message: with --json its body, else a human line.
func (t *tail) print(msg jetstream.Msg) error {
	var (
		seq  = "?"
		when = "?"
	)
	if md, err := msg.Metadata(); err == nil {
		seq = strconv.FormatUint(md.Sequence.Stream, 10)
		when = md.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	body := msg.Data()
	if t.json {
		return t.printJSON(seq, msg.Subject(), body)
	}
	_, err := fmt.Fprintln(t.out, humanLine(seq, when, msg.Subject(), body))
	return err
}

// printJSON writes the body as it is, one line: a body that spans lines
// (not one the relay wrote) is compacted. A body that is not JSON goes to
// stderr, so that stdout stays one JSON value a line for a script.
func (t *tail) printJSON(seq, subject string, body []byte) error {
	if !json.Valid(body) {
		t.errOut.println(fmt.Sprintf("quill: seq %s on %s: not JSON (%d bytes), not printed: %s",
			seq, cli.Printable(subject), len(body), excerpt(body)))
		return nil
	}
	if bytes.ContainsAny(body, "\r\n") {
		var b bytes.Buffer
		if err := json.Compact(&b, body); err != nil {
			return err
		}
		body = b.Bytes()
	}
	_, err := fmt.Fprintf(t.out, "%s\n", body)
	return err
}

// tailEvent is the part of a CloudEvent a human line shows.
type tailEvent struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Time    string          `json:"time"`
	Data    json.RawMessage `json:"data"`
}

// humanLine is one message for a person: the event's time, the stream
// sequence, the type, the note, the event id and a summary of the data.
// Every value from the message is escaped (printable, strconv.Quote): an
// event must not write control characters or terminal escape sequences
// to a terminal. A message that is not a CloudEvent is shown as such,
// with its arrival time and seq.
func humanLine(seq, arrived, subject string, body []byte) string {
	var ev tailEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		what := "not JSON"
		if json.Valid(body) {
			what = "not a CloudEvent"
		}
		return fmt.Sprintf("%s  seq %s  %s (%d bytes on %s): %s", arrived, seq, what, len(body), cli.Printable(subject), excerpt(body))
	}
	if ev.ID == "" || ev.Type == "" {
		return fmt.Sprintf("%s  seq %s  not a CloudEvent (no id or type; %d bytes on %s): %s", arrived, seq, len(body), cli.Printable(subject), excerpt(body))
	}
	return fmt.Sprintf("%s  seq %s  %s  note %s  event %s  %s", cli.Printable(ev.Time), seq, cli.Printable(ev.Type),
		cli.Printable(ev.Subject), cli.Printable(ev.ID), summary(ev.Type, ev.Data))
}

// summary describes an event's data in a few words. A title is shown
// (quoted, cut to tailTitleRunes) because a tail is output for the person
// who runs it, not a log (decision 0054); a body never is, only its length.
func summary(typ string, data json.RawMessage) string {
	unreadable := "data does not have the shape of " + cli.Printable(typ)
	switch typ {
	case contract.CloudEventType(contract.EventNoteCreated):
		var d struct {
			Title      string `json:"title"`
			Body       string `json:"body"`
			Attachment *struct {
				ContentType string `json:"content_type"`
				Size        int64  `json:"size"`
				Status      string `json:"status"`
			} `json:"attachment"`
		}
		if json.Unmarshal(data, &d) != nil {
			return unreadable
		}
		s := fmt.Sprintf("title %s  body %d chars", strconv.Quote(cut(d.Title, tailTitleRunes)), utf8.RuneCountInString(d.Body))
		if a := d.Attachment; a != nil {
			s += fmt.Sprintf("  attachment %s %d bytes %s", cli.Printable(a.ContentType), a.Size, cli.Printable(a.Status))
		}
		return s
	case contract.CloudEventType(contract.EventNoteDeleted):
		var d struct {
			DeletedAt string `json:"deleted_at"`
		}
		if json.Unmarshal(data, &d) != nil {
			return unreadable
		}
		return "deleted at " + cli.Printable(d.DeletedAt)
	case contract.CloudEventType(contract.EventAttachmentProcessed):
		var d struct {
			State        string `json:"state"`
			DetectedType string `json:"detected_type"`
			Reason       string `json:"reason"`
		}
		if json.Unmarshal(data, &d) != nil {
			return unreadable
		}
		s := "attachment " + cli.Printable(d.State)
		if d.DetectedType != "" {
			s += " as " + cli.Printable(d.DetectedType)
		}
		if d.Reason != "" {
			s += ": " + cli.Printable(d.Reason)
		}
		return s
	}
	return fmt.Sprintf("data %d bytes", len(data))
}

// cut returns s cut to n runes, marked with an ellipsis when cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// excerpt is the start of a body that could not be shown as an event,
// quoted and escaped.
func excerpt(b []byte) string {
	if len(b) > tailExcerptBytes {
		return strconv.Quote(string(b[:tailExcerptBytes])) + "…"
	}
	return strconv.Quote(string(b))
}

// lockedWriter serialises lines written from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) println(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(l.w, s)
}
