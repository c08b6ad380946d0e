package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/wait"
)

// Modes.
const (
	modeCreate = "create"
	modeReplay = "replay"
	// modeUpdate creates one note per client before measuring; then each
	// client updates its own note, under If-Match the ETag its previous
	// answer carried and a new key each time.
	modeUpdate = "update"
	// modeSeed creates --count notes as fast as it can and exits: the
	// backlog of a worker benchmark.
	modeSeed = "seed"
)

// attachments are the files --attachment may add to every create: the
// worker benchmark's fixtures, so the rates compare.
var attachments = map[string]struct {
	filename, contentType string
	data                  func() []byte
}{
	"png64k": {"bench.png", "image/png", attachment.BenchFixturePNG64K},
	"text4k": {"bench.txt", "text/plain", attachment.BenchFixtureText4K},
}

// Defaults of the flags.
const (
	defaultURL         = "http://127.0.0.1:8080"
	defaultConcurrency = 16
	defaultDuration    = 10 * time.Second
	defaultWarmup      = 2 * time.Second
	defaultTimeout     = 10 * time.Second
	defaultBodyBytes   = 200
	// minReplayKeys is the smallest automatic replay key set.
	minReplayKeys = 1000
	// notesPath is the endpoint every request goes to.
	notesPath = "/v1/notes"
)

// config is one run's settings.
type config struct {
	url         string
	token       string
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	timeout     time.Duration
	mode        string
	replayKeys  int
	bodyBytes   int
	keyPrefix   string
	jsonOut     bool
	count       int
	// attachment names an entry of attachments ("": none).
	attachment string
	// rate > 0: requests start on a fixed schedule, rate per second
	// (open loop), instead of each client sending as soon as it can.
	rate float64
}

var keyPrefixRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: loadgen --token T [flags]\n\nDrives POST /v1/notes and reports throughput, latency and errors.\n\nFlags:")
		fs.PrintDefaults()
	}
	envOr := cli.EnvOr(getenv)
	fs.StringVar(&c.url, "url", envOr("QUILL_URL", defaultURL), "API base URL; requests go to <url>/v1/notes (env QUILL_URL)")
	fs.StringVar(&c.token, "token", getenv("QUILL_TOKEN"), "bearer token (env QUILL_TOKEN)")
	fs.IntVar(&c.concurrency, "concurrency", defaultConcurrency, "concurrent clients, each with its own keep-alive connection")
	fs.DurationVar(&c.duration, "duration", defaultDuration, "measured time, after the warmup")
	fs.DurationVar(&c.warmup, "warmup", defaultWarmup, "time the load runs before measuring starts")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "per-request timeout")
	fs.StringVar(&c.mode, "mode", modeCreate, "create: new notes under unique keys; replay: create --replay-keys notes, then resend them and expect replays; update: create one note per client, then each client updates its own (PATCH, If-Match, unique keys); seed: create --count notes and exit")
	fs.IntVar(&c.count, "count", 1000, "seed mode: how many notes to create")
	fs.StringVar(&c.attachment, "attachment", "", "add this attachment to every create: png64k (a 64 KiB PNG) or text4k (4 KiB of text), the worker benchmark's fixtures")
	fs.IntVar(&c.replayKeys, "replay-keys", 0, fmt.Sprintf("replay mode: how many notes to create and replay (0: max(%d, 16 × concurrency))", minReplayKeys))
	fs.IntVar(&c.bodyBytes, "body-bytes", defaultBodyBytes, "length of each note's body text")
	fs.StringVar(&c.keyPrefix, "key-prefix", "", "prefix of the generated Idempotency-Keys (default: random per run, so runs never collide)")
	fs.BoolVar(&c.jsonOut, "json", false, "print the result as one JSON object")
	fs.Float64Var(&c.rate, "rate", 0, "requests per second on a fixed schedule, whatever the answers take (0: every client sends as soon as its previous request answered); --concurrency caps the requests in flight, and latency counts from each request's scheduled start")
	if err := cli.ParseFlags(fs, args); err != nil {
		return c, err
	}
	u, err := url.Parse(c.url)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return c, cli.UsageError{Msg: fmt.Sprintf("--url %q is not an http(s) URL such as %s", c.url, defaultURL)}
	case c.token == "":
		return c, cli.UsageError{Msg: "--token (or QUILL_TOKEN) is required; create one with: api token create --tenant bench"}
	case c.concurrency < 1:
		return c, cli.UsageError{Msg: "--concurrency must be at least 1"}
	case c.duration <= 0:
		return c, cli.UsageError{Msg: "--duration must be positive"}
	case c.warmup < 0:
		return c, cli.UsageError{Msg: "--warmup must not be negative"}
	case c.timeout <= 0:
		return c, cli.UsageError{Msg: "--timeout must be positive"}
	case c.mode != modeCreate && c.mode != modeReplay && c.mode != modeUpdate && c.mode != modeSeed:
		return c, cli.UsageError{Msg: fmt.Sprintf("--mode %q: use %s, %s, %s or %s", c.mode, modeCreate, modeReplay, modeUpdate, modeSeed)}
	case c.mode == modeSeed && c.count < 1:
		return c, cli.UsageError{Msg: "--count must be at least 1"}
	case c.rate < 0 || math.IsInf(c.rate, 0) || math.IsNaN(c.rate):
		return c, cli.UsageError{Msg: "--rate must be a non-negative number of requests per second"}
	case c.replayKeys < 0:
		return c, cli.UsageError{Msg: "--replay-keys must not be negative"}
	case c.bodyBytes < 0:
		return c, cli.UsageError{Msg: "--body-bytes must not be negative"}
	case c.attachment != "" && attachments[c.attachment].data == nil:
		return c, cli.UsageError{Msg: fmt.Sprintf("--attachment %q: use png64k or text4k", c.attachment)}
	case c.keyPrefix != "" && !keyPrefixRE.MatchString(c.keyPrefix):
		return c, cli.UsageError{Msg: "--key-prefix must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-'"}
	}
	if c.keyPrefix == "" {
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			return c, fmt.Errorf("random key prefix: %w", err)
		}
		c.keyPrefix = "lg-" + hex.EncodeToString(b[:])
	}
	if c.mode == modeSeed {
		c.replayKeys = c.count
	}
	if c.mode == modeReplay && c.replayKeys == 0 {
		c.replayKeys = max(minReplayKeys, 16*c.concurrency)
	}
	if c.mode == modeReplay && c.replayKeys < c.concurrency {
		// Every client replays its own keys, so that no two requests with
		// one key are in flight at once.
		return c, cli.UsageError{Msg: fmt.Sprintf("--replay-keys (%d) must be at least --concurrency (%d)", c.replayKeys, c.concurrency)}
	}
	return c, nil
}

// run is the whole program: main only wires signals and the exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if cli.AsksVersion(args) {
		cli.PrintVersion("loadgen", stdout)
		return nil
	}
	c, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	cl := newClient(c)
	defer cl.close()

	var (
		targets []target
		owned   []noteRef
	)
	if c.mode == modeSeed {
		t0 := time.Now()
		if _, err := setupReplay(ctx, cl, c); err != nil {
			return err
		}
		s := time.Since(t0).Seconds()
		res := map[string]any{"mode": modeSeed, "created": c.count, "seconds": measure.Round(s, 3),
			"ops_per_sec": measure.Round(float64(c.count)/s, 1), "attachment": c.attachment}
		if c.jsonOut {
			return json.NewEncoder(stdout).Encode(res)
		}
		fmt.Fprintf(stdout, "created %d notes in %.2fs\n", c.count, s)
		return nil
	}
	if c.mode == modeReplay {
		t0 := time.Now()
		if targets, err = setupReplay(ctx, cl, c); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "loadgen: replay setup: created %d notes in %.2fs\n", len(targets), time.Since(t0).Seconds())
	}
	if c.mode == modeUpdate {
		t0 := time.Now()
		if owned, err = setupUpdate(ctx, cl, c); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "loadgen: update setup: created %d notes in %.2fs\n", len(owned), time.Since(t0).Seconds())
	}
	res := runLoad(ctx, cl, c, targets, owned, stderr)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if c.jsonOut {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return err
		}
	} else {
		writeText(stdout, res)
	}
	if res.OK == 0 && res.Errors > 0 {
		return fmt.Errorf("no request succeeded; first error: %s", res.FirstError)
	}
	return nil
}

// target is one request: its key and its body; an update's also its note
// and the version it is made against.
type target struct {
	key  string
	body []byte
	// noteID is the note an update acts on ("": a create).
	noteID string
	// ifMatch is the version an update is made against.
	ifMatch int
}

// noteRef is a note an update-mode client owns: its id and the version the
// last answer about it named.
type noteRef struct {
	id      string
	version int
}

// client sends the requests.
type client struct {
	hc       *http.Client
	tr       *http.Transport
	endpoint string
	auth     string
	cfg      config
	filler   string
	// attach is the JSON of the attachment member, with its leading
	// comma, or empty.
	attach string
}

func newClient(c config) *client {
	tr := &http.Transport{
		Proxy:               nil, // never route the benchmark through a proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        c.concurrency,
		MaxIdleConnsPerHost: c.concurrency,
		MaxConnsPerHost:     c.concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	filler := strings.Repeat("lorem ipsum dolor sit amet ", c.bodyBytes/27+1)[:c.bodyBytes]
	var attach string
	if a, ok := attachments[c.attachment]; ok {
		attach = fmt.Sprintf(`,"attachment":{"filename":%q,"content_type":%q,"data":"%s"}`,
			a.filename, a.contentType, base64.StdEncoding.EncodeToString(a.data()))
	}
	return &client{
		attach:   attach,
		hc:       &http.Client{Transport: tr, Timeout: c.timeout},
		tr:       tr,
		endpoint: strings.TrimRight(c.url, "/") + notesPath,
		auth:     "Bearer " + c.token,
		cfg:      c,
		filler:   filler,
	}
}

func (cl *client) close() { cl.tr.CloseIdleConnections() }

// newTarget returns client w's seq-th request. Keys and titles only hold
// characters that need no JSON escaping.
func (cl *client) newTarget(w, seq int) target {
	return cl.createTarget(cl.cfg.keyPrefix + "-" + strconv.Itoa(w) + "-" + strconv.Itoa(seq))
}

// createTarget is the create of a note under key.
func (cl *client) createTarget(key string) target {
	body := make([]byte, 0, len(key)+len(cl.filler)+len(cl.attach)+40)
	body = append(body, `{"title":"bench note `...)
	body = append(body, key...)
	body = append(body, `","body":"`...)
	body = append(body, cl.filler...)
	body = append(body, '"')
	body = append(body, cl.attach...)
	body = append(body, '}')
	return target{key: key, body: body}
}

// updateTarget is client w's seq-th update of note n, made against the
// version last seen: a new title and a new body (the key, then the filler),
// so that every update changes the note and both fields go into its event.
// Its keys (<prefix>-u-<w>-<seq>) never meet a create's (<prefix>-<w>-<seq>)
// or a setup note's (<prefix>-note-<w>).
func (cl *client) updateTarget(w, seq int, n noteRef) target {
	key := cl.cfg.keyPrefix + "-u-" + strconv.Itoa(w) + "-" + strconv.Itoa(seq)
	body := make([]byte, 0, 2*len(key)+len(cl.filler)+40)
	body = append(body, `{"title":"bench edit `...)
	body = append(body, key...)
	body = append(body, `","body":"`...)
	body = append(body, key...)
	body = append(body, ' ')
	body = append(body, cl.filler...)
	body = append(body, `"}`...)
	return target{key: key, body: body, noteID: n.id, ifMatch: n.version}
}

// outcome is what one request came back with.
type outcome struct {
	status   int
	replayed bool
	err      error
	// etag is the version the answer's ETag names (0: none or not a
	// strong decimal tag).
	etag int
	// ifMatch is the request's If-Match (0: none).
	ifMatch int
	// body is the answer's body, kept only when asked for (send's keep)
	// or for a 412 (its current_version).
	body []byte
}

// send sends t: a POST of a create, or a PATCH of t.noteID under If-Match.
// With keep the answer's body is returned; otherwise only a 412's is.
func (cl *client) send(ctx context.Context, t target, keep bool) outcome {
	method, endpoint := http.MethodPost, cl.endpoint
	if t.noteID != "" {
		method, endpoint = http.MethodPatch, cl.endpoint+"/"+t.noteID
	}
	req, err := http.NewRequestWithContext(ctx, method, endpoint, bytes.NewReader(t.body))
	if err != nil {
		return outcome{err: err}
	}
	req.Header.Set("Authorization", cl.auth)
	req.Header.Set("Idempotency-Key", t.key)
	req.Header.Set("Content-Type", "application/json")
	if t.noteID != "" {
		req.Header.Set("If-Match", `"`+strconv.Itoa(t.ifMatch)+`"`)
	}
	resp, err := cl.hc.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	o := outcome{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		etag: parseETag(resp.Header.Get("ETag")), ifMatch: t.ifMatch}
	if keep || resp.StatusCode == http.StatusPreconditionFailed {
		o.body, o.err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	}
	// Drain the body so that the connection is reused.
	if _, err := io.Copy(io.Discard, resp.Body); o.err == nil {
		o.err = err
	}
	resp.Body.Close()
	return o
}

// parseETag is the version a strong ETag "N" names; 0 when h is not one.
func parseETag(h string) int {
	if len(h) < 3 || h[0] != '"' || h[len(h)-1] != '"' {
		return 0
	}
	v, err := strconv.Atoi(h[1 : len(h)-1])
	if err != nil || v < 1 {
		return 0
	}
	return v
}

// currentVersion is the current_version a 412's problem names (0: none).
func (o outcome) currentVersion() int {
	var p struct {
		CurrentVersion int `json:"current_version"`
	}
	if json.Unmarshal(o.body, &p) != nil {
		return 0
	}
	return p.CurrentVersion
}

// kind classifies an outcome in mode: "" for success, else the error kind.
func (o outcome) kind(mode string) string {
	switch {
	case o.err != nil:
		return "transport"
	case o.status < 200 || o.status > 299:
		return "http_" + strconv.Itoa(o.status)
	case mode == modeCreate && o.replayed:
		return "unexpected_replay"
	case mode == modeReplay && !o.replayed:
		return "not_replayed"
	case mode == modeUpdate && o.replayed:
		return "unexpected_replay"
	case mode == modeUpdate && o.status != http.StatusOK:
		return "http_" + strconv.Itoa(o.status)
	case mode == modeUpdate && o.etag != o.ifMatch+1:
		// A 200 that made no new version (the update changed nothing) or
		// without the version's ETag.
		return "version_not_advanced"
	}
	return ""
}

// setupUpdate creates one note per client, each under its own key, and
// returns them at the version their 201 named (1). Any failure ends the run.
func setupUpdate(ctx context.Context, cl *client, c config) ([]noteRef, error) {
	notes := make([]noteRef, c.concurrency)
	errs := make([]error, c.concurrency)
	var wg sync.WaitGroup
	for w := range c.concurrency {
		wg.Go(func() {
			o := cl.send(ctx, cl.createTarget(cl.cfg.keyPrefix+"-note-"+strconv.Itoa(w)), true)
			if k := o.kind(modeCreate); k != "" {
				errs[w] = fmt.Errorf("update setup: creating note %d: %s", w, describe(o, k))
				return
			}
			var n struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(o.body, &n); err != nil || n.ID == "" || o.etag == 0 {
				errs[w] = fmt.Errorf("update setup: note %d: no id in the 201's body (%v) or no ETag", w, err)
				return
			}
			notes[w] = noteRef{id: n.ID, version: o.etag}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted during update setup: %w", err)
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return notes, nil
}

// setupReplay creates c.replayKeys notes, spread over the clients, and
// returns their requests. Any failure ends the run: a replay benchmark needs
// every key recorded.
func setupReplay(ctx context.Context, cl *client, c config) ([]target, error) {
	targets := make([]target, c.replayKeys)
	for i := range targets {
		targets[i] = cl.newTarget(i%c.concurrency, i/c.concurrency)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for w := range c.concurrency {
		wg.Go(func() {
			for i := w; i < len(targets); i += c.concurrency {
				o := cl.send(ctx, targets[i], false)
				if k := o.kind(modeCreate); k != "" {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("replay setup: creating note %d: %s", i, describe(o, k))
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted during replay setup: %w", err)
	}
	return targets, firstErr
}

func describe(o outcome, kind string) string {
	if o.err != nil {
		return o.err.Error()
	}
	return fmt.Sprintf("%s (status %d, replayed %t)", kind, o.status, o.replayed)
}

// workerStats is what one client measured.
type workerStats struct {
	lat      []time.Duration // successful measured requests
	errs     map[string]int
	refused  int // update mode: measured 412s
	firstErr string
	maxLag   time.Duration // rate mode: the latest start after its schedule
}

// result is a run's report.
type result struct {
	Mode        string  `json:"mode"`
	URL         string  `json:"url"`
	Concurrency int     `json:"concurrency"`
	WarmupS     float64 `json:"warmup_s"`
	DurationS   float64 `json:"duration_s"`
	ReplayKeys  int     `json:"replay_keys,omitempty"`
	// Notes is how many notes update mode created and updated (one per
	// client).
	Notes      int    `json:"notes,omitempty"`
	Requests   int    `json:"requests"`
	OK         int    `json:"ok"`
	Errors     int    `json:"errors"`
	ErrorKinds string `json:"error_kinds"`
	FirstError string `json:"first_error,omitempty"`
	// PreconditionFailed counts the measured 412 answers (update mode;
	// also among the errors, as http_412). Each client updating only its
	// own note, any is a server that refused an update made against the
	// version it had itself just answered.
	PreconditionFailed int     `json:"precondition_failed"`
	OpsPerSec          float64 `json:"ops_per_sec"`
	// The latency of the successful measured requests; its fields stand
	// in the result's own JSON object (n, min_ms, p50_ms, ...).
	measure.Dist
	// CPUSeconds is the loadgen's own user+system CPU time during the
	// measured window, CPUCores that divided by the window (-1: unknown).
	CPUSeconds float64 `json:"cpu_seconds"`
	CPUCores   float64 `json:"cpu_cores"`

	// TargetRate is --rate; MaxSendLagMs the longest a request started
	// after its scheduled time (all clients busy, or the scheduler late).
	TargetRate   float64 `json:"target_rate,omitempty"`
	MaxSendLagMs float64 `json:"max_send_lag_ms,omitempty"`
}

// runLoad runs the load: c.concurrency clients, each sending its next
// request as soon as the previous one answered — or, with c.rate, when the
// next slot of the fixed schedule comes (start + i/rate for the i-th
// request, whichever client is free takes it) — for c.warmup unmeasured and
// then c.duration measured. In replay mode client w cycles over the targets
// w, w+c, w+2c, ...; in update mode client w updates owned[w], following
// the ETag of each answer (after a 412, the current_version it names).
// Progress lines go to progress: "warming up" at the start
// and "measuring" when the measured window opens (scripts sample other
// processes' CPU use inside the window from it).
func runLoad(ctx context.Context, cl *client, c config, targets []target, owned []noteRef, progress io.Writer) result {
	start := time.Now()
	measureFrom := start.Add(c.warmup)
	end := measureFrom.Add(c.duration)
	fmt.Fprintf(progress, "loadgen: %s, %d clients: warming up for %s\n", c.mode, c.concurrency, c.warmup)

	// The loadgen's CPU time over the measured window.
	cpuStart := make(chan float64, 1)
	go func() {
		t := time.NewTimer(time.Until(measureFrom))
		defer t.Stop()
		select {
		case <-t.C:
			cpuStart <- measure.ProcessCPU()
			fmt.Fprintf(progress, "loadgen: measuring for %s\n", c.duration)
		case <-ctx.Done():
			cpuStart <- -1
		}
	}()

	stats := make([]workerStats, c.concurrency)
	var slots atomic.Int64 // c.rate > 0: the next schedule slot to take
	var wg sync.WaitGroup
	for w := range c.concurrency {
		wg.Go(func() {
			st := &stats[w]
			st.lat = make([]time.Duration, 0, 1<<14)
			st.errs = map[string]int{}
			for seq := 0; ; seq++ {
				t0 := time.Now()
				if c.rate > 0 {
					// Latency counts from the scheduled start, so that a
					// late start (every client busy) is not hidden.
					slot := slots.Add(1) - 1
					due := start.Add(time.Duration(float64(slot) * float64(time.Second) / c.rate))
					if !due.Before(end) || !wait.For(ctx, time.Until(due)) {
						return
					}
					st.maxLag = max(st.maxLag, time.Since(due))
					t0 = due
				}
				if !t0.Before(end) || ctx.Err() != nil {
					return
				}
				var t target
				switch c.mode {
				case modeReplay:
					// Client w owns the targets with index ≡ w (mod concurrency).
					n := (len(targets) - w + c.concurrency - 1) / c.concurrency
					t = targets[w+(seq%n)*c.concurrency]
				case modeUpdate:
					t = cl.updateTarget(w, seq, owned[w])
				default:
					t = cl.newTarget(w, seq)
				}
				o := cl.send(ctx, t, false)
				d := time.Since(t0)
				if c.mode == modeUpdate {
					follow(&owned[w], o)
				}
				if ctx.Err() != nil || t0.Before(measureFrom) {
					continue
				}
				if k := o.kind(c.mode); k != "" {
					if o.status == http.StatusPreconditionFailed {
						st.refused++
					}
					st.errs[k]++
					if st.firstErr == "" {
						st.firstErr = describe(o, k)
					}
					continue
				}
				st.lat = append(st.lat, d)
			}
		})
	}
	wg.Wait()
	wall := time.Since(measureFrom)
	cpu0 := <-cpuStart
	cpu1 := measure.ProcessCPU()

	res := result{
		Mode: c.mode, URL: cl.endpoint, Concurrency: c.concurrency,
		WarmupS: c.warmup.Seconds(), DurationS: measure.Round(wall.Seconds(), 3),
	}
	if c.mode == modeReplay {
		res.ReplayKeys = len(targets)
	}
	if c.mode == modeUpdate {
		res.Notes = len(owned)
	}
	if c.rate > 0 {
		res.TargetRate = c.rate
		var lag time.Duration
		for _, st := range stats {
			lag = max(lag, st.maxLag)
		}
		res.MaxSendLagMs = measure.Ms(lag)
	}
	var all []time.Duration
	errs := map[string]int{}
	for _, st := range stats {
		all = append(all, st.lat...)
		for k, n := range st.errs {
			errs[k] += n
			res.Errors += n
		}
		res.PreconditionFailed += st.refused
		if res.FirstError == "" {
			res.FirstError = st.firstErr
		}
	}
	res.OK = len(all)
	res.Requests = res.OK + res.Errors
	res.ErrorKinds = formatKinds(errs)
	if wall > 0 {
		res.OpsPerSec = measure.Round(float64(res.OK)/wall.Seconds(), 1)
	}
	res.CPUSeconds, res.CPUCores = measure.CPUUse(cpu0, cpu1, wall)
	res.Dist = measure.Summarize(all)
	return res
}

// follow moves n to the version answer o names: an accepted update's ETag,
// or the current_version of a 412. After any other answer (a transport
// failure, a 5xx: the update may or may not have been made) n stays; if it
// was made, the next update's 412 names the version to go on from.
func follow(n *noteRef, o outcome) {
	switch {
	case o.err == nil && o.status == http.StatusOK && o.etag > 0:
		n.version = o.etag
	case o.status == http.StatusPreconditionFailed:
		if v := o.currentVersion(); v > 0 {
			n.version = v
		}
	}
}

func formatKinds(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Itoa(m[k])
	}
	return strings.Join(parts, ",")
}

func writeText(w io.Writer, r result) {
	method, where := "POST", r.URL
	if r.Mode == modeUpdate {
		method, where = "PATCH", r.URL+"/{id}"
	}
	fmt.Fprintf(w, "loadgen: %s, %d clients, %.2fs measured after %gs warmup, %s %s\n",
		r.Mode, r.Concurrency, r.DurationS, r.WarmupS, method, where)
	if r.Mode == modeReplay {
		fmt.Fprintf(w, "  replay keys  %d\n", r.ReplayKeys)
	}
	if r.Mode == modeUpdate {
		fmt.Fprintf(w, "  notes        %d (one per client); 412 answers %d\n", r.Notes, r.PreconditionFailed)
	}
	fmt.Fprintf(w, "  requests     %d ok, %d errors", r.OK, r.Errors)
	if r.Errors > 0 {
		fmt.Fprintf(w, " (%s; first: %s)", r.ErrorKinds, r.FirstError)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  throughput   %.1f/s", r.OpsPerSec)
	if r.TargetRate > 0 {
		fmt.Fprintf(w, " (target %g/s; latest start %.2fms after its schedule)", r.TargetRate, r.MaxSendLagMs)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  latency      p50 %.2fms  p90 %.2fms  p99 %.2fms  p99.9 %.2fms  max %.2fms  mean %.2fms\n",
		r.P50, r.P90, r.P99, r.P999, r.Max, r.Mean)
	if r.CPUCores >= 0 {
		fmt.Fprintf(w, "  loadgen CPU  %.2f cores (%.2fs user+sys)\n", r.CPUCores, r.CPUSeconds)
	} else {
		fmt.Fprintln(w, "  loadgen CPU  unknown (no /proc/self/stat)")
	}
}
