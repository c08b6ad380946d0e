package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/dispatch"
	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/whsecret"
)

const usage = `usage: webhookbench [flags]

Runs a signature-checking receiver, sends --events signed POSTs to it
directly, then through the running webhook dispatcher (events published
onto its stream), then --rate events/s for --duration through the
dispatcher, and reports deliveries/s of both, their ratio, and the
dispatcher's commit → delivered latency. Flags:`

// options are the command's flags.
type options struct {
	databaseURL, natsURL, streamName, prefix string
	secretKey, tenant, metricsURL            string
	profileDir                               string
	events, concurrency, rate                int
	duration, timeout                        time.Duration
	// receiverDelay is how long the receiver takes to answer, for
	// both phases: 0 is a receiver that does nothing; a remote endpoint
	// takes a network round trip and its own work.
	receiverDelay time.Duration
	asJSON        bool
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	env := cli.EnvOr(getenv)
	var o options
	fs := flag.NewFlagSet("webhookbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, usage); fs.PrintDefaults() }
	fs.StringVar(&o.databaseURL, "database-url", env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/quill?sslmode=disable"), "the dispatcher's database (DATABASE_URL)")
	fs.StringVar(&o.natsURL, "nats-url", env("NATS_URL", nats.DefaultURL), "the dispatcher's NATS (NATS_URL)")
	fs.StringVar(&o.streamName, "stream", contract.DefaultStream, "the stream the dispatcher consumes (created as the relay creates it when missing)")
	fs.StringVar(&o.prefix, "subject-prefix", contract.DefaultSubjectPrefix, "the stream's subject prefix")
	fs.StringVar(&o.secretKey, "secret-key", env(whsecret.KeyEnv, ""), "the dispatcher's "+whsecret.KeyEnv+" (seals the endpoint's secret)")
	fs.StringVar(&o.tenant, "tenant", "bench", "the endpoint's tenant")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "the dispatcher's /metrics, for quill_webhook_delivery_seconds (optional)")
	fs.StringVar(&o.profileDir, "profile-dir", "", "write a CPU profile of the dispatcher (QUILL_PPROF=true, at --metrics-url's host) over the drain here")
	fs.IntVar(&o.events, "events", 5000, "POSTs sent directly, and events delivered by the dispatcher, in phases 1 and 2")
	fs.IntVar(&o.concurrency, "concurrency", dispatch.DefaultEndpointConcurrency, "direct senders: the dispatcher's POSTs in flight to one endpoint (QUILL_WEBHOOK_ENDPOINT_CONCURRENCY)")
	fs.IntVar(&o.rate, "rate", 200, "events/s of phase 3")
	fs.DurationVar(&o.duration, "duration", 20*time.Second, "length of phase 3")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long a phase may wait for its deliveries")
	fs.DurationVar(&o.receiverDelay, "receiver-delay", 0, "how long the receiver takes to answer each POST, in both phases (0: at once)")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case o.events < 1, o.concurrency < 1, o.rate < 1:
		return cli.UsageError{Msg: "--events, --concurrency and --rate must be at least 1"}
	case o.duration <= 0 || o.timeout <= 0:
		return cli.UsageError{Msg: "--duration and --timeout must be positive"}
	case o.secretKey == "":
		return cli.UsageError{Msg: "--secret-key (or " + whsecret.KeyEnv + ") is required: the dispatcher's key"}
	case len(fs.Args()) > 0:
		return cli.UsageError{Msg: "webhookbench takes no arguments"}
	}
	keys, err := whsecret.ParseKeys(o.secretKey)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	rep, err := bench(ctx, o, keys, stderr)
	if err != nil {
		return err
	}
	if o.asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	rep.print(stdout)
	return nil
}

// report is what the run measured.
type report struct {
	Events          int     `json:"events"`
	Concurrency     int     `json:"concurrency"`
	BodyBytes       int     `json:"body_bytes"`
	ReceiverDelayMs float64 `json:"receiver_delay_ms"`

	DirectPerS     float64      `json:"direct_per_s"`
	DispatchPerS   float64      `json:"dispatcher_per_s"`
	PublishPerS    float64      `json:"publish_per_s"`
	Ratio          float64      `json:"ratio"`
	DrainLatencyMs measure.Dist `json:"drain_latency"`

	Rate          int          `json:"rate"`
	DurationS     float64      `json:"duration_s"`
	Published     int          `json:"paced_published"`
	AchievedRate  float64      `json:"paced_rate"`
	LatencyMs     measure.Dist `json:"latency"`
	HistogramP99  string       `json:"histogram_p99_le"`
	HistogramN    float64      `json:"histogram_count"`
	BadSignatures int64        `json:"bad_signatures"`
	Duplicates    int64        `json:"duplicates"`
}

func (r report) print(w io.Writer) {
	fmt.Fprintf(w, "phase 1 direct:     %d POSTs (%d B bodies, the receiver answering after %.0f ms), %d senders: %.0f deliveries/s\n",
		r.Events, r.BodyBytes, r.ReceiverDelayMs, r.Concurrency, r.DirectPerS)
	fmt.Fprintf(w, "phase 2 dispatcher: %d events published at %.0f/s, drained at %.0f deliveries/s (publish → delivered p50 %.0f ms, max %.0f ms)\n",
		r.Events, r.PublishPerS, r.DispatchPerS, r.DrainLatencyMs.P50, r.DrainLatencyMs.Max)
	fmt.Fprintf(w, "ratio dispatcher ÷ direct: %.3f\n", r.Ratio)
	fmt.Fprintf(w, "phase 3 paced:      %d events over %.1f s (%.1f/s, asked %d/s): commit → delivered p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		r.Published, r.DurationS, r.AchievedRate, r.Rate, r.LatencyMs.P50, r.LatencyMs.P90, r.LatencyMs.P99, r.LatencyMs.Max)
	if r.HistogramP99 != "" {
		fmt.Fprintf(w, "quill_webhook_delivery_seconds over phase 3: %.0f observations, p99 ≤ %s s\n", r.HistogramN, r.HistogramP99)
	}
	fmt.Fprintf(w, "bad signatures %d, duplicates %d\n", r.BadSignatures, r.Duplicates)
}

func bench(ctx context.Context, o options, keys *whsecret.Keys, stderr io.Writer) (*report, error) {
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "webhookbench: "+format+"\n", a...) }
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	nc, err := nats.Connect(o.natsURL)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	sc := stream.Config{Name: o.streamName, SubjectPrefix: o.prefix}.WithDefaults()
	if _, err := stream.Provision(ctx, js, sc); err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}

	rc := newReceiver()
	rc.delay = o.receiverDelay
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/hook"

	endpoint := uuid.New()
	secret, err := whsecret.NewSecret()
	if err != nil {
		return nil, err
	}
	rc.secret, err = secretKey(secret)
	if err != nil {
		return nil, err
	}
	sealed, err := keys.Seal(secret, o.tenant, endpoint.String())
	if err != nil {
		return nil, err
	}
	// As the API inserts it; created a second ago, so that every event
	// published from now on is after it.
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, tenant, url, event_types, secret_sealed, created_at)
VALUES ($1, $2, $3, $4, $5, now() - interval '1 second')`, endpoint, o.tenant, url, ceTypes(), sealed); err != nil {
		return nil, fmt.Errorf("insert the endpoint: %w", err)
	}
	rep := &report{Events: o.events, Concurrency: o.concurrency, Rate: o.rate}

	// Phase 1: the same POSTs, directly.
	client, err := dispatch.NewClient(true, "", o.concurrency)
	if err != nil {
		return nil, err
	}
	direct := make([]event, o.events)
	for i := range direct {
		direct[i] = newEvent(o.tenant, time.Now())
	}
	rep.BodyBytes = len(direct[0].body)
	rep.ReceiverDelayMs = float64(o.receiverDelay) / float64(time.Millisecond)
	logf("phase 1: %d POSTs directly with %d senders", o.events, o.concurrency)
	elapsed, err := sendDirect(ctx, client, url, secret, direct, o.concurrency)
	if err != nil {
		return nil, err
	}
	rep.DirectPerS = float64(o.events) / elapsed.Seconds()
	client.CloseIdleConnections()

	// Phase 2: as many events through the dispatcher, published as fast
	// as JetStream takes them.
	drain := make([]event, o.events)
	for i := range drain {
		drain[i] = newEvent(o.tenant, time.Time{})
	}
	logf("phase 2: %d events through the dispatcher", o.events)
	stopProfile := profile(ctx, o, logf)
	t0 := time.Now()
	pubDone, err := publish(ctx, js, sc, o.tenant, drain, 0)
	if err != nil {
		return nil, err
	}
	rep.PublishPerS = float64(o.events) / pubDone.Sub(t0).Seconds()
	last, lat, err := rc.wait(ctx, drain, o.timeout)
	stopProfile()
	if err != nil {
		return nil, err
	}
	rep.DispatchPerS = float64(o.events) / last.Sub(t0).Seconds()
	rep.DrainLatencyMs = measure.Summarize(lat)
	rep.Ratio = measure.Round(rep.DispatchPerS/rep.DirectPerS, 4)

	// Phase 3: paced.
	before, err := scrape(ctx, o.metricsURL)
	if err != nil {
		logf("cannot read %s: %v", o.metricsURL, err)
	}
	n := int(float64(o.rate) * o.duration.Seconds())
	paced := make([]event, n)
	for i := range paced {
		paced[i] = newEvent(o.tenant, time.Time{})
	}
	logf("phase 3: %d events/s for %s", o.rate, o.duration)
	t0 = time.Now()
	pubDone, err = publish(ctx, js, sc, o.tenant, paced, o.rate)
	if err != nil {
		return nil, err
	}
	rep.Published = n
	rep.DurationS = measure.Round(pubDone.Sub(t0).Seconds(), 2)
	rep.AchievedRate = measure.Round(float64(n)/pubDone.Sub(t0).Seconds(), 1)
	_, lat, err = rc.wait(ctx, paced, o.timeout)
	if err != nil {
		return nil, err
	}
	rep.LatencyMs = measure.Summarize(lat)
	if before != nil {
		// The dispatcher observes after the 2xx: give it a moment.
		time.Sleep(500 * time.Millisecond)
		after, err := scrape(ctx, o.metricsURL)
		if err != nil {
			logf("cannot read %s: %v", o.metricsURL, err)
		} else {
			rep.HistogramP99, rep.HistogramN = bucketQuantile(before, after, 0.99)
		}
	}
	rep.BadSignatures, rep.Duplicates = rc.bad.Load(), rc.dups.Load()
	if rep.BadSignatures > 0 {
		return rep, fmt.Errorf("%d POSTs did not verify", rep.BadSignatures)
	}
	return rep, nil
}

// event is one CloudEvent of the benchmark.
type event struct {
	id, note string
	body     []byte
	// at is the event's time (its "commit"); set at publication when zero.
	at time.Time
}

// filler pads a note to the size of a typical one (~600 B event).
var filler = strings.Repeat("a webhook benchmark note ", 12)

func newEvent(tenant string, at time.Time) event {
	e := event{id: uuid.NewString(), note: uuid.NewString(), at: at}
	if !at.IsZero() {
		e.body = e.render(tenant)
	}
	return e
}

// render is the event as the relay publishes it: a note.created
// CloudEvent of version 1 (every event a note of its own, so no event
// waits for another's version).
func (e *event) render(tenant string) []byte {
	data := fmt.Sprintf(`{"id":%q,"version":1,"title":"bench","body":%q,"tags":["bench"]}`, e.note, filler)
	return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"%s","type":%q,"subject":%q,"time":%q,"datacontenttype":"application/json","data":%s}`,
		e.id, contract.Source(tenant), contract.CloudEventType(contract.EventNoteCreated), e.note, e.at.UTC().Format(time.RFC3339Nano), data)
}

// sendDirect POSTs every event with c senders, signed as the dispatcher
// signs (dispatch's headers), and returns the time it took. Any answer but
// a 2xx is an error.
func sendDirect(ctx context.Context, client *http.Client, url, secret string, events []event, c int) (time.Duration, error) {
	next := make(chan event)
	errs := make(chan error, c)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := range next {
				ts := time.Now().Unix()
				sig, err := whsecret.Sign([]string{secret}, e.id, ts, e.body)
				if err == nil {
					err = post(ctx, client, url, e, ts, sig)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
loop:
	for _, e := range events {
		select {
		case next <- e:
		case err = <-errs:
			break loop
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return time.Since(t0), err
}

func post(ctx context.Context, client *http.Client, url string, e event, ts int64, sig string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(e.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/cloudevents+json")
	req.Header.Set("User-Agent", dispatch.UserAgent)
	req.Header.Set("webhook-id", e.id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("direct POST: %w", err)
	}
	_, _ = io.CopyN(io.Discard, resp.Body, dispatch.MaxResponseBody)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("direct POST: status %d", resp.StatusCode)
	}
	return nil
}

// publish publishes events onto the stream as the relay does (subject of
// the tenant and type, Nats-Msg-Id the event id, asynchronously); at rate
// per second when rate > 0, else as fast as acknowledgements allow. An
// event without a time gets its time of publication. It returns when
// every publication was acknowledged.
func publish(ctx context.Context, js jetstream.JetStream, sc stream.Config, tenant string, events []event, rate int) (time.Time, error) {
	t0 := time.Now()
	var acks []jetstream.PubAckFuture
	for i := range events {
		e := &events[i]
		if rate > 0 {
			due := t0.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-ctx.Done():
					return time.Time{}, ctx.Err()
				case <-time.After(d):
				}
			}
		}
		if e.body == nil {
			e.at = time.Now()
			e.body = e.render(tenant)
		}
		f, err := js.PublishAsync(contract.Subject(sc.SubjectPrefix, tenant, contract.EventNoteCreated), e.body, jetstream.WithMsgID(e.id))
		if err != nil {
			return time.Time{}, fmt.Errorf("publish: %w", err)
		}
		acks = append(acks, f)
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return time.Time{}, fmt.Errorf("publish: %w", err)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
	return time.Now(), nil
}

// receiver verifies and records each POST.
type receiver struct {
	secret []byte
	delay  time.Duration

	mu   sync.Mutex
	got  map[string]time.Time // first arrival by webhook-id
	cond *sync.Cond

	bad, dups atomic.Int64
}

func newReceiver() *receiver {
	r := &receiver{got: map[string]time.Time{}}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func secretKey(secret string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, whsecret.Prefix))
	if err != nil {
		return nil, fmt.Errorf("secret: %w", err)
	}
	return b, nil
}

// verify checks a v1 signature of id.timestamp.body, as a Standard
// Webhooks receiver does (timestamp within five minutes).
func (rc *receiver) verify(id, ts, sigs string, body []byte) bool {
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || math.Abs(float64(time.Now().Unix()-t)) > 300 {
		return false
	}
	h := hmac.New(sha256.New, rc.secret)
	fmt.Fprintf(h, "%s.%s.", id, ts)
	h.Write(body)
	want := h.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		v, ok := strings.CutPrefix(s, "v1,")
		if !ok {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(v)
		if err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	id := r.Header.Get("webhook-id")
	if err != nil || r.Method != http.MethodPost || !rc.verify(id, r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature"), body) {
		rc.bad.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	rc.mu.Lock()
	if _, ok := rc.got[id]; ok {
		rc.dups.Add(1)
	} else {
		rc.got[id] = at
		rc.cond.Broadcast()
	}
	rc.mu.Unlock()
	if rc.delay > 0 {
		time.Sleep(rc.delay) // the remote endpoint's round trip and work
	}
	w.WriteHeader(http.StatusNoContent)
}

// wait waits until every event arrived, then returns the last arrival and
// each event's time → arrival.
func (rc *receiver) wait(ctx context.Context, events []event, timeout time.Duration) (time.Time, []time.Duration, error) {
	deadline := time.Now().Add(timeout)
	stop := context.AfterFunc(ctx, func() { rc.mu.Lock(); rc.cond.Broadcast(); rc.mu.Unlock() })
	defer stop()
	tick := time.AfterFunc(timeout, func() { rc.mu.Lock(); rc.cond.Broadcast(); rc.mu.Unlock() })
	defer tick.Stop()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	i := 0
	for i < len(events) {
		if _, ok := rc.got[events[i].id]; ok {
			i++
			continue
		}
		if ctx.Err() != nil {
			return time.Time{}, nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			return time.Time{}, nil, fmt.Errorf("only %d of %d events delivered within %s", i, len(events), timeout)
		}
		// Wake at least every second to look at the deadline.
		t := time.AfterFunc(time.Second, func() { rc.mu.Lock(); rc.cond.Broadcast(); rc.mu.Unlock() })
		rc.cond.Wait()
		t.Stop()
	}
	var last time.Time
	lat := make([]time.Duration, len(events))
	for i, e := range events {
		at := rc.got[e.id]
		if at.After(last) {
			last = at
		}
		lat[i] = at.Sub(e.at)
	}
	return last, lat, nil
}

// profile fetches a CPU profile of the dispatcher into o.profileDir while
// phase 2 runs; the returned func waits for it.
func profile(ctx context.Context, o options, logf func(string, ...any)) func() {
	if o.profileDir == "" || o.metricsURL == "" {
		return func() {}
	}
	base := strings.TrimSuffix(o.metricsURL, "/metrics")
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Long enough for a drain; cut short (the profile then is lost)
		// only when the drain outlasts it by far.
		req, err := http.NewRequestWithContext(pctx, http.MethodGet, base+"/debug/pprof/profile?seconds=10", nil)
		if err != nil {
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			logf("profile: %v", err)
			return
		}
		defer resp.Body.Close()
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			logf("profile: %v", err)
			return
		}
		f, err := os.Create(filepath.Join(o.profileDir, "dispatcher-cpu.pprof"))
		if err != nil {
			logf("profile: %v", err)
			return
		}
		defer f.Close()
		if _, err := io.Copy(f, resp.Body); err != nil {
			logf("profile: %v", err)
		}
	}()
	return func() {
		select {
		case <-done:
		case <-time.After(15 * time.Second):
		}
		cancel()
		<-done
	}
}

// histogram is quill_webhook_delivery_seconds's cumulative buckets by le.
type histogram map[string]float64

func scrape(ctx context.Context, url string) (histogram, error) {
	if url == "" {
		return nil, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	h := histogram{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	const name = `quill_webhook_delivery_seconds_bucket{le="`
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		le, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		h[le] = v
	}
	if len(h) == 0 {
		return nil, errors.New("no quill_webhook_delivery_seconds_bucket series")
	}
	return h, sc.Err()
}

// bucketQuantile is the upper bound of the bucket holding quantile q of
// the observations between two scrapes, and their count.
func bucketQuantile(before, after histogram, q float64) (string, float64) {
	type b struct {
		le string
		ub float64
		n  float64
	}
	var bs []b
	for le, n := range after {
		ub := math.Inf(1)
		if le != "+Inf" {
			ub, _ = strconv.ParseFloat(le, 64)
		}
		bs = append(bs, b{le, ub, n - before[le]})
	}
	slices.SortFunc(bs, func(x, y b) int {
		switch {
		case x.ub < y.ub:
			return -1
		case x.ub > y.ub:
			return 1
		}
		return 0
	})
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return "", 0
	}
	total := bs[len(bs)-1].n
	for _, x := range bs {
		if x.n >= q*total {
			return x.le, total
		}
	}
	return "+Inf", total
}

// ceTypes is every event type as the API stores an endpoint's: CloudEvents
// types.
func ceTypes() []string {
	var out []string
	for _, t := range contract.EventTypes() {
		out = append(out, contract.CloudEventType(t))
	}
	return out
}
