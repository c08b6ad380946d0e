package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/notes"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
)

const overview = `usage: relaybench seed|raw|stream|wait|latency|reset [flags]

  seed     write --count pending events over --notes notes into outbox_events
  raw      publish --count messages of the same size into a fresh stream of the
           relay's kind (the JetStream ceiling) and report the rate
  stream   create --stream as the relay defines it, or set an existing one's
           replicas to --replicas; wait until every replica is current
  wait     wait until --stream holds --count messages and no event is pending;
           report the publish rate
  latency  commit → stream store and commit → marked, per event of a window
  reset    delete --stream if it exists

Each prints one JSON object. "relaybench SUBCOMMAND --help" lists its flags.`

// The stream's defaults, so that raw creates the kind of stream the relay
// provisions; this block is the only place relaybench names their package.
const (
	defaultStream          = contract.DefaultStream
	defaultSubjectPrefix   = contract.DefaultSubjectPrefix
	defaultDuplicateWindow = stream.DefaultDuplicateWindow
	defaultMaxAge          = stream.DefaultMaxAge
)

// The relay's publish settings that raw mirrors. bench-relay.sh passes
// --max-pending explicitly (twice the batch its relays run with); the
// relay's acknowledgement timeout is not configurable.
const (
	defaultMaxPending = 2 * 256 // the relay allows 2 × its batch (default 256) in flight
	defaultAckTimeout = 10 * time.Second
)

// common holds the flags every subcommand may use.
type common struct {
	natsURL, databaseURL, stream, prefix, tenant  string
	count, notes, bodyBytes, maxPending, replicas int
	duplicateWindow, maxAge, ackTimeout, timeout  time.Duration
	from, to, apiLog                              string
	// progress gets the lines scripts wait for ("publishing").
	progress io.Writer
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if cli.AsksVersion(args) {
		cli.PrintVersion("relaybench", stdout)
		return nil
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, overview)
		if len(args) == 0 {
			return cli.UsageError{Msg: "a subcommand is required"}
		}
		return nil
	}
	sub, args := args[0], args[1:]
	envOr := cli.EnvOr(getenv)
	c := common{progress: stderr}
	fs := flag.NewFlagSet("relaybench "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsFlags := func() {
		fs.StringVar(&c.natsURL, "nats-url", envOr("NATS_URL", nats.DefaultURL), "NATS URL (env NATS_URL)")
	}
	pgFlags := func() {
		fs.StringVar(&c.databaseURL, "database-url", envOr("DATABASE_URL", db.DefaultURL), "PostgreSQL URL (env DATABASE_URL)")
	}
	streamFlags := func() {
		fs.StringVar(&c.stream, "stream", envOr("QUILL_STREAM", defaultStream), "stream name (env QUILL_STREAM)")
	}
	defFlags := func() {
		fs.StringVar(&c.prefix, "subject-prefix", envOr("QUILL_SUBJECT_PREFIX", defaultSubjectPrefix), "first token of the subjects (env QUILL_SUBJECT_PREFIX)")
		fs.DurationVar(&c.duplicateWindow, "duplicate-window", defaultDuplicateWindow, "the stream's Duplicates window (the relay's default)")
		fs.DurationVar(&c.maxAge, "max-age", defaultMaxAge, "the stream's MaxAge (the relay's default)")
		fs.IntVar(&c.replicas, "replicas", 1, "the stream's replicas (3 on a three-node cluster)")
	}
	genFlags := func() {
		fs.IntVar(&c.count, "count", 100_000, "number of events (messages)")
		fs.IntVar(&c.notes, "notes", 20_000, "number of notes the events belong to")
		fs.StringVar(&c.tenant, "tenant", "bench", "tenant of the events")
		fs.IntVar(&c.bodyBytes, "body-bytes", 200, "length of each note's body text (loadgen's default)")
	}
	var do func(context.Context, common, io.Writer) error
	switch sub {
	case "seed":
		pgFlags()
		genFlags()
		do = seed
	case "raw":
		natsFlags()
		streamFlags()
		genFlags()
		defFlags()
		fs.IntVar(&c.maxPending, "max-pending", defaultMaxPending, "most unacknowledged publishes at once (the relay allows 2 × its batch)")
		fs.DurationVar(&c.ackTimeout, "ack-timeout", defaultAckTimeout, "how long a publish waits for its acknowledgement, and for a free slot (the relay's)")
		fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up after")
		do = raw
	case "stream":
		natsFlags()
		streamFlags()
		defFlags()
		fs.DurationVar(&c.timeout, "timeout", time.Minute, "give up after (a new cluster first elects its meta leader)")
		do = ensureStream
	case "wait":
		natsFlags()
		pgFlags()
		streamFlags()
		fs.IntVar(&c.count, "count", 100_000, "messages the stream must hold")
		fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up after")
		do = wait
	case "latency":
		natsFlags()
		pgFlags()
		streamFlags()
		fs.StringVar(&c.from, "from", "", "window start, Unix seconds (date +%s.%N): events created from then on")
		fs.StringVar(&c.to, "to", "", "window end, Unix seconds: events created before then (default: no end)")
		fs.StringVar(&c.apiLog, "api-log", "", "the API's JSON log: its request lines (time, key_hash) give each create's answer time, after its commit")
		do = latency
	case "reset":
		natsFlags()
		streamFlags()
		do = reset
	default:
		return cli.UsageError{Msg: fmt.Sprintf("unknown subcommand %q; run \"relaybench --help\"", sub)}
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case (sub == "seed" || sub == "raw") && (c.count < 1 || c.notes < 1 || c.notes > c.count):
		return cli.UsageError{Msg: "--count and --notes must be positive, with --notes ≤ --count"}
	case (sub == "raw" || sub == "stream") && (c.replicas < 1 || c.replicas > 5):
		return cli.UsageError{Msg: "--replicas must be 1–5"}
	case sub == "raw" && c.maxPending < 1:
		return cli.UsageError{Msg: "--max-pending must be positive"}
	case sub == "raw" && c.ackTimeout <= 0:
		return cli.UsageError{Msg: "--ack-timeout must be positive"}
	case sub == "wait" && c.count < 1:
		return cli.UsageError{Msg: "--count must be positive"}
	case sub == "latency" && c.from == "":
		return cli.UsageError{Msg: "--from is required"}
	}
	return do(ctx, c, stdout)
}

// writeJSON prints v as one line of JSON.
func writeJSON(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

// --- events ------------------------------------------------------------------------

// event is one generated outbox event.
type event struct {
	id, note uuid.UUID
	key      string
	payload  []byte
}

// generate returns count events over nNotes notes (count/nNotes each, the
// remainder spread), in a random but reproducible note order, each with the
// CloudEvents JSON the API writes for a created note: the note's view with
// a loadgen-like title and a body of bodyBytes characters. Only the shape
// matters to the relay; every event is a note.created.
func generate(count, nNotes, bodyBytes int, tenant string, at time.Time) ([]event, error) {
	noteIDs := make([]uuid.UUID, nNotes)
	for i := range noteIDs {
		noteIDs[i] = uuid.Must(uuid.NewV7())
	}
	order := make([]int, count)
	for i := range order {
		order[i] = i % nNotes
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	var rb [6]byte
	for i := range rb {
		rb[i] = byte(rng.UintN(256))
	}
	run := fmt.Sprintf("seed-%x", rb)
	filler := strings.Repeat("lorem ipsum dolor sit amet ", bodyBytes/27+1)[:bodyBytes]
	created := notes.FormatTime(at)
	events := make([]event, count)
	for i, n := range order {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		key := run + "-" + strconv.Itoa(i)
		view := notes.NoteView{ID: noteIDs[n].String(), Title: "bench note " + key, Body: filler, CreatedAt: created}
		payload, err := outbox.Envelope(outbox.Event{ID: id, Tenant: tenant, OperationKey: key, AggregateID: noteIDs[n],
			Type: contract.EventNoteCreated, Time: at, Data: view})
		if err != nil {
			return nil, err
		}
		events[i] = event{id: id, note: noteIDs[n], key: key, payload: payload}
	}
	return events, nil
}

func avgPayload(events []event) float64 {
	total := 0
	for _, e := range events {
		total += len(e.payload)
	}
	return measure.Round(float64(total)/float64(len(events)), 1)
}

func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// seed writes the events as pending rows with COPY, in seq order.
func seed(ctx context.Context, c common, stdout io.Writer) error {
	at := time.Now().UTC().Truncate(time.Microsecond)
	events, err := generate(c.count, c.notes, c.bodyBytes, c.tenant, at)
	if err != nil {
		return err
	}
	pool, err := db.Open(ctx, c.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	t0 := time.Now()
	rows := make([][]any, len(events))
	for i, e := range events {
		rows[i] = []any{pgUUID(e.id), c.tenant, e.key, pgUUID(e.note), contract.EventNoteCreated, e.payload, at}
	}
	n, err := pool.CopyFrom(ctx, pgx.Identifier{"outbox_events"},
		[]string{"id", "tenant", "operation_key", "aggregate_id", "type", "payload", "created_at"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("copy events: %w", err)
	}
	return writeJSON(stdout, map[string]any{
		"events": n, "notes": c.notes, "payload_avg_bytes": avgPayload(events), "copy_s": measure.Round(time.Since(t0).Seconds(), 3),
	})
}

// --- NATS --------------------------------------------------------------------------

// connect opens a NATS connection named name and a JetStream context on
// it; the caller closes the connection.
func connect(url, name string, opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("JetStream at %s: %w", url, err)
	}
	return nc, js, nil
}

func reset(ctx context.Context, c common, stdout io.Writer) error {
	nc, js, err := connect(c.natsURL, "quill-relaybench")
	if err != nil {
		return err
	}
	defer nc.Close()
	deleted, err := deleteStream(ctx, js, c.stream)
	if err != nil {
		return err
	}
	return writeJSON(stdout, map[string]any{"stream": c.stream, "deleted": deleted})
}

// apiTimeout bounds one JetStream API request.
const apiTimeout = 5 * time.Second

func deleteStream(ctx context.Context, js jetstream.JetStream, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := js.DeleteStream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete stream %s: %w", name, err)
	}
	return true, nil
}

// span is the stream's first and last message store times.
type span struct {
	Messages uint64  `json:"messages"`
	LastSeq  uint64  `json:"last_seq"`
	First    string  `json:"first_stored"`
	Last     string  `json:"last_stored"`
	SpanS    float64 `json:"span_s"`
	// Rate is (messages − 1) ÷ span: messages stored per second from the
	// first to the last.
	Rate       float64 `json:"rate"`
	Storage    string  `json:"storage"`
	Duplicates string  `json:"duplicate_window"`
	// Replicas is the stream's replicas when it was read (after the run:
	// a relay that provisions without them turns R3 into R1).
	Replicas int `json:"replicas"`
}

func streamSpan(ctx context.Context, js jetstream.JetStream, name string) (span, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return span{}, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return span{}, fmt.Errorf("stream %s info: %w", name, err)
	}
	st := info.State
	out := span{Messages: st.Msgs, LastSeq: st.LastSeq, Storage: info.Config.Storage.String(), Duplicates: info.Config.Duplicates.String(),
		Replicas: info.Config.Replicas}
	if st.Msgs == 0 {
		return out, nil
	}
	first, err := s.GetMsg(ctx, st.FirstSeq)
	if err != nil {
		return span{}, fmt.Errorf("stream %s message %d: %w", name, st.FirstSeq, err)
	}
	last, err := s.GetMsg(ctx, st.LastSeq)
	if err != nil {
		return span{}, fmt.Errorf("stream %s message %d: %w", name, st.LastSeq, err)
	}
	d := last.Time.Sub(first.Time)
	out.First, out.Last = first.Time.UTC().Format(time.RFC3339Nano), last.Time.UTC().Format(time.RFC3339Nano)
	out.SpanS = measure.Round(d.Seconds(), 4)
	if d > 0 {
		out.Rate = measure.Round(float64(st.Msgs-1)/d.Seconds(), 1)
	}
	return out, nil
}

// raw publishes like the relay does — jetstream.PublishMsgAsync with the
// relay's options (its acknowledgement timeout, bounded pending acks), the
// event id as Nats-Msg-Id and the same headers — but with nothing else to
// do: no claim, no mark, no pauses between batches.
func raw(ctx context.Context, c common, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	events, err := generate(c.count, c.notes, c.bodyBytes, c.tenant, time.Now().UTC().Truncate(time.Microsecond))
	if err != nil {
		return err
	}
	nc, js, err := connect(c.natsURL, "quill-relaybench-raw", jetstream.WithPublishAsyncTimeout(c.ackTimeout),
		jetstream.WithPublishAsyncMaxPending(c.maxPending))
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := deleteStream(ctx, js, c.stream); err != nil {
		return err
	}
	if _, err := provision(ctx, js, c); err != nil {
		return err
	}
	subject := contract.Subject(c.prefix, c.tenant, contract.EventNoteCreated)

	futures := make([]jetstream.PubAckFuture, len(events))
	fmt.Fprintf(c.progress, "relaybench: publishing %d messages to %s\n", len(events), subject)
	cpu0 := measure.ProcessCPU()
	t0 := time.Now()
	var pubErrs int
	var firstErr error
	for i, e := range events {
		msg := nats.NewMsg(subject)
		msg.Data = e.payload
		msg.Header.Set(jetstream.MsgIDHeader, e.id.String())
		msg.Header.Set("Content-Type", "application/cloudevents+json")
		// A full window waits for a free slot (up to the ack timeout)
		// instead of failing after nats.go's default 200 ms: the relay
		// never has more than a batch (half the bound) in flight, so it
		// never stalls; with sync_interval always an ack can take longer.
		if futures[i], err = js.PublishMsgAsync(msg, jetstream.WithStallWait(c.ackTimeout)); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			pubErrs++
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return fmt.Errorf("waiting for acknowledgements: %w", ctx.Err())
	}
	wall := time.Since(t0)
	cpu1 := measure.ProcessCPU()

	acked, dups, ackErrs := 0, 0, 0
	for _, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			acked++
			if ack.Duplicate {
				dups++
			}
		case err := <-f.Err():
			if firstErr == nil {
				firstErr = err
			}
			ackErrs++
		default:
			ackErrs++ // PublishAsyncComplete closed: nothing is outstanding
		}
	}
	sp, err := streamSpan(ctx, js, c.stream)
	if err != nil {
		return err
	}
	out := map[string]any{
		"messages": len(events), "acked": acked, "duplicates": dups, "errors": pubErrs + ackErrs,
		"publish_errors": pubErrs, "ack_errors": ackErrs,
		"payload_avg_bytes": avgPayload(events), "max_pending": c.maxPending,
		"client_s": measure.Round(wall.Seconds(), 4), "client_rate": measure.Round(float64(acked)/wall.Seconds(), 1),
		"stream": sp,
	}
	_, out["cpu_cores"] = measure.CPUUse(cpu0, cpu1, wall)
	if firstErr != nil {
		// Reported, not fatal: the rate of what was stored still stands,
		// and the script shows the errors.
		out["first_error"] = firstErr.Error()
		fmt.Fprintf(c.progress, "relaybench: %d of %d messages acknowledged; first error: %v\n", acked, len(events), firstErr)
	}
	return writeJSON(stdout, out)
}

// streamConfig is the stream the relay provisions, field for field, with
// c.replicas.
func streamConfig(c common) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: c.stream, Subjects: []string{c.prefix + ".>"}, Storage: jetstream.FileStorage,
		Duplicates: c.duplicateWindow, MaxAge: c.maxAge, Replicas: c.replicas,
	}
}

// provision creates the stream, or sets an existing one's replicas to
// c.replicas (keeping its other settings), retrying until c's deadline: a
// cluster that has just started answers "no JetStream meta leader" for a
// while. It then waits until every replica is current, so that what is
// measured next is replication, not catching up.
func provision(ctx context.Context, js jetstream.JetStream, c common) (*jetstream.StreamInfo, error) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		// Each attempt has its own deadline: a request that a cluster
		// dropped while electing its meta leader is never answered, and
		// would otherwise wait for the whole run's.
		actx, cancel := context.WithTimeout(ctx, apiTimeout)
		info, err := provisionOnce(actx, js, c)
		cancel()
		if err == nil && replicasCurrent(info, c.replicas) {
			return info, nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("stream %s: replicas not yet current", c.stream)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%w)", last, ctx.Err())
		case <-tick.C:
		}
	}
}

func provisionOnce(ctx context.Context, js jetstream.JetStream, c common) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, c.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, streamConfig(c))
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", c.stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s info: %w", c.stream, err)
	}
	if info.Config.Replicas != c.replicas {
		cfg := info.Config
		cfg.Replicas = c.replicas
		if s, err = js.UpdateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("stream %s: set replicas %d: %w", c.stream, c.replicas, err)
		}
		info = s.CachedInfo()
	}
	return info, nil
}

// replicasCurrent reports whether the stream has a leader and n−1 current
// followers (always true for R1 on a single server).
func replicasCurrent(info *jetstream.StreamInfo, n int) bool {
	if n <= 1 {
		return true
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return false
	}
	current := 0
	for _, p := range info.Cluster.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	return current >= n-1
}

// ensureStream is the stream subcommand.
func ensureStream(ctx context.Context, c common, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	nc, js, err := connect(c.natsURL, "quill-relaybench-stream")
	if err != nil {
		return err
	}
	defer nc.Close()
	info, err := provision(ctx, js, c)
	for err == nil && !replicasCurrent(info, c.replicas) {
		// An update's info can predate its replication: read it again.
		select {
		case <-ctx.Done():
			return fmt.Errorf("stream %s: replicas not current: %w", c.stream, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
		var s jetstream.Stream
		if s, err = js.Stream(ctx, c.stream); err == nil {
			info, err = s.Info(ctx)
		}
	}
	if err != nil {
		return err
	}
	out := map[string]any{"stream": c.stream, "replicas": info.Config.Replicas, "messages": info.State.Msgs}
	if info.Cluster != nil {
		out["cluster"], out["leader"] = info.Cluster.Name, info.Cluster.Leader
	}
	return writeJSON(stdout, out)
}

// wait polls the stream (cheap) until it holds c.count messages, then the
// outbox until no event is pending (the last marks), and reports the rate.
func wait(ctx context.Context, c common, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	t0 := time.Now()
	nc, js, err := connect(c.natsURL, "quill-relaybench-wait")
	if err != nil {
		return err
	}
	defer nc.Close()
	pool, err := db.Open(ctx, c.databaseURL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()

	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var msgs uint64
	for msgs < uint64(c.count) {
		s, err := js.Stream(ctx, c.stream)
		switch {
		case err == nil:
			msgs = s.CachedInfo().State.Msgs
		case !errors.Is(err, jetstream.ErrStreamNotFound) && ctx.Err() == nil:
			return fmt.Errorf("stream %s: %w", c.stream, err)
		}
		if msgs >= uint64(c.count) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stream %s holds %d of %d messages: %w", c.stream, msgs, c.count, ctx.Err())
		case <-tick.C:
		}
	}
	stored := time.Since(t0)
	for {
		pending, err := pendingEvents(ctx, pool)
		if err != nil {
			return err
		}
		if pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d events still pending: %w", pending, ctx.Err())
		case <-tick.C:
		}
	}
	marked := time.Since(t0)
	sp, err := streamSpan(ctx, js, c.stream)
	if err != nil {
		return err
	}
	return writeJSON(stdout, map[string]any{
		"stream": sp, "all_stored_s": measure.Round(stored.Seconds(), 3), "all_marked_s": measure.Round(marked.Seconds(), 3),
	})
}

// pendingEvents counts the relays' queue (exactly the unpublished events,
// migration 00007): polled while the relays run, so it must not scan the
// outbox, which has no index on published_at.
func pendingEvents(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_pending`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending events: %w", err)
	}
	return n, nil
}

// --- latency -----------------------------------------------------------------------

// stored is what the stream says about one event.
type stored struct {
	at     time.Time // the server's store timestamp
	ceTime time.Time // the CloudEvents time in the payload
}

// latency joins the outbox rows created in [from, to) with their messages
// in the stream and reports, per event:
//
//   - store: stream store timestamp − CloudEvents time. The CloudEvents time
//     (= created_at) is the API's clock when it planned the transaction,
//     before BEGIN, so this is commit → stored plus the transaction's own
//     duration; the acknowledgement leaves the server right after the store
//     (after the fsync with sync_interval always);
//   - answered (with --api-log): stream store timestamp − the time the API
//     logged the create's answer, which it does after the commit: a lower
//     bound of commit → stored (negative when the relay was faster than the
//     API's log line);
//   - mark: published_at − created_at: published_at is now() of the relay's
//     mark transaction, which starts after the whole batch's acks — an upper
//     bound of commit → ack.
func latency(ctx context.Context, c common, stdout io.Writer) error {
	from, err := parseUnix(c.from)
	if err != nil {
		return cli.UsageError{Msg: "--from: " + err.Error()}
	}
	to := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if c.to != "" {
		if to, err = parseUnix(c.to); err != nil {
			return cli.UsageError{Msg: "--to: " + err.Error()}
		}
	}
	nc, js, err := connect(c.natsURL, "quill-relaybench-latency")
	if err != nil {
		return err
	}
	defer nc.Close()
	msgs, err := readStream(ctx, js, c.stream)
	if err != nil {
		return err
	}
	pool, err := db.Open(ctx, c.databaseURL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	var answered map[string]time.Time
	if c.apiLog != "" {
		if answered, err = readAPILog(c.apiLog); err != nil {
			return err
		}
	}
	rows, err := pool.Query(ctx, `SELECT id, tenant, coalesce(operation_key, ''), created_at, published_at
		FROM outbox_events WHERE created_at >= $1 AND created_at < $2`, from, to)
	if err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	var storeLat, markLat, answeredLat []time.Duration
	events, unpublished, notInStream, timeMismatch := 0, 0, 0, 0
	for rows.Next() {
		var id uuid.UUID
		var tenant, key string
		var created time.Time
		var published *time.Time
		if err := rows.Scan(&id, &tenant, &key, &created, &published); err != nil {
			return fmt.Errorf("read events: %w", err)
		}
		events++
		if published == nil {
			unpublished++
			continue
		}
		markLat = append(markLat, published.Sub(created))
		m, ok := msgs[id]
		if !ok {
			notInStream++
			continue
		}
		if !m.ceTime.Equal(created) {
			timeMismatch++
		}
		storeLat = append(storeLat, m.at.Sub(m.ceTime))
		if at, ok := answered[opkey.Hash(tenant, key)]; ok && key != "" {
			answeredLat = append(answeredLat, m.at.Sub(at))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	out := map[string]any{
		"events": events, "unpublished": unpublished, "not_in_stream": notInStream,
		"ce_time_ne_created_at": timeMismatch, "stream_messages": len(msgs),
		"store": measure.Summarize(storeLat), "mark": measure.Summarize(markLat),
	}
	if c.apiLog != "" {
		out["answered"] = measure.Summarize(answeredLat)
	}
	if err := writeJSON(stdout, out); err != nil {
		return err
	}
	if events == 0 {
		return errors.New("no events in the window")
	}
	return nil
}

// readAPILog returns, by key hash, when the API logged its answer to each
// successful (201) create: the request log line is written after the
// handler returned, so after the commit.
func readAPILog(path string) (map[string]time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("API log: %w", err)
	}
	out := map[string]time.Time{}
	for line := range bytes.Lines(b) {
		if !bytes.Contains(line, []byte(`"key_hash"`)) {
			continue
		}
		var l struct {
			Message string `json:"message"`
			Method  string `json:"method"`
			Status  int    `json:"status"`
			KeyHash string `json:"key_hash"`
			Time    string `json:"time"`
		}
		if err := json.Unmarshal(line, &l); err != nil || l.Message != "request" || l.Method != "POST" || l.Status != 201 {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, l.Time)
		if err != nil {
			return nil, fmt.Errorf("API log: time %q: %w", l.Time, err)
		}
		if _, seen := out[l.KeyHash]; !seen {
			out[l.KeyHash] = t
		}
	}
	return out, nil
}

func parseUnix(s string) (time.Time, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		return time.Time{}, fmt.Errorf("%q is not Unix seconds", s)
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC(), nil
}

// readStream reads every message of the stream with an ordered consumer and
// returns, by event id (Nats-Msg-Id), its store time and CloudEvents time.
func readStream(ctx context.Context, js jetstream.JetStream, name string) (map[uuid.UUID]stored, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	total := s.CachedInfo().State.Msgs
	out := make(map[uuid.UUID]stored, total)
	if total == 0 {
		return out, nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("ordered consumer on %s: %w", name, err)
	}
	var seen uint64
	for seen < total {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("fetch from %s: %w", name, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			seen++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			id, err := uuid.Parse(m.Headers().Get(jetstream.MsgIDHeader))
			if err != nil {
				return nil, fmt.Errorf("message %d: Nats-Msg-Id: %w", md.Sequence.Stream, err)
			}
			ce, err := ceTime(m.Data())
			if err != nil {
				return nil, fmt.Errorf("message %d: %w", md.Sequence.Stream, err)
			}
			out[id] = stored{at: md.Timestamp, ceTime: ce}
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("fetch from %s: %w", name, err)
		}
		if got == 0 {
			return nil, fmt.Errorf("stream %s: read %d of %d messages, then nothing more", name, seen, total)
		}
	}
	return out, nil
}

func ceTime(payload []byte) (time.Time, error) {
	var ce struct {
		Time string `json:"time"`
	}
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&ce); err != nil {
		return time.Time{}, fmt.Errorf("payload is not CloudEvents JSON: %w", err)
	}
	t, err := time.Parse(time.RFC3339Nano, ce.Time)
	if err != nil {
		return time.Time{}, fmt.Errorf("CloudEvents time %q: %w", ce.Time, err)
	}
	return t, nil
}
