package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/quillhq/quill/internal/wait"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Operation kinds.
const (
	opCreate = "create"
	opUpdate = "update"
	opDelete = "delete"
)

// What an update's client expects, from what it knew when it sent it.
const (
	// expectUpdated: made against the version the client knows is the
	// note's (nothing happened to the note since it saw it), changing a
	// field: 200 with the next version.
	expectUpdated = "updated"
	// expectUnchanged: against the note's version, setting what the note
	// holds: 200 with the same version, no event.
	expectUnchanged = "unchanged"
	// expectStale: against the version before the one the client knows
	// is the note's, like an agent acting on an old read: 412 naming the
	// note's version.
	expectStale = "stale"
	// expectGone: of a note the client deleted (its delete answered 200):
	// 404.
	expectGone = "gone"
	// expectEither: against the version the client last saw, after an
	// operation on the note whose outcome it never learnt: 200 or 412.
	expectEither = "either"
	// expectRace: one of two agents updating the note from the version
	// both read: one 200, one 412 (checked as a pair).
	expectRace = "race"
)

// Attachment kinds of a create.
const (
	attPNG  = "png"
	attText = "text"
	attNone = "none"
)

// answer is a decided response: the status, ETag and body a client may
// act on.
type answer struct {
	Status   int
	ETag     string
	Body     []byte
	Replayed bool
}

// op is one business operation — one Idempotency-Key — and everything its
// requests saw.
type op struct {
	Kind         string
	Client       int
	Tenant, Key  string
	token        string
	Title        string
	request      []byte // create: the JSON body
	Att          string // create: attPNG, attText or attNone
	AttSHA       string
	Lines, Words int    // attText: the expected statistics
	NoteID       string // delete, update: the target; create: from the decided answer
	ExpectStatus int    // delete: 200 (a live note) or 404 (already deleted)
	// IfMatch is the version an update is made against (its If-Match),
	// and a delete's when it sends one (0: none).
	IfMatch int
	// SetTitle and SetBody are what an update sets (nil: keeps it).
	SetTitle, SetBody *string
	// Expect is what an update's client expects (expect*); Known the
	// version it knew to be the note's when it sent it (0: unsure).
	Expect string
	Known  int
	// After412 marks an update sent as a new intent after an update of
	// the note was refused with 412 and the client read the note again.
	After412 bool
	// Rival is the other agent's update of a race (expectRace).
	Rival      *op
	Copies     int  // sends of the operation (1, or 2–5 for a resent one)
	Concurrent bool // the copies were sent at once
	// Impatient: the client gives up after the first request without a
	// decided answer, like an agent whose deadline passed; its outcome is
	// unknown to it and only the lookup after the run tells.
	Impatient bool

	mu        sync.Mutex
	requests  int
	undecided map[string]int // transport, http_409, http_503, ...
	decided   []answer
	gaveUp    int // copies that ran out of time without a decided answer
}

func (o *op) record(kind string, a *answer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.requests++
	if a != nil {
		o.decided = append(o.decided, *a)
		return
	}
	if o.undecided == nil {
		o.undecided = map[string]int{}
	}
	o.undecided[kind]++
}

// Decided returns the first decided answer, or nil when every request's
// outcome stayed unknown.
func (o *op) Decided() *answer {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.decided) == 0 {
		return nil
	}
	a := o.decided[0]
	return &a
}

// GaveUp reports whether a copy of o ran out of time (or patience)
// without a decided answer.
func (o *op) GaveUp() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.gaveUp > 0
}

// tenant is one tenant of the run and its bearer token.
type tenant struct{ Name, Token string }

// loadStats counts the requests clients sent and what came back; reads
// are the GETs of notes clients made to learn a note's version again.
type loadStats struct {
	requests, transport, reads atomic.Int64
	mu                         sync.Mutex
	status                     map[int]int64
}

// loadGen drives the APIs through their fault proxies: clients goroutines take
// operation slots from a fixed schedule (rate per second), each operation
// a create (with a PNG, a text or no attachment), an update (PATCH under
// If-Match, see client) or a delete of a note the client created;
// ResendShare of them are sent 2–5 times under their key,
// half of those concurrently. Every request without a decided answer
// (transport error, 409, 5xx) is retried under the same key until
// opDeadline. With several APIs, each request goes to the next one in turn,
// so that a resend under a key often reaches another API than the first
// send.
type loadGen struct {
	bases      []string
	next       atomic.Uint64 // the API of the next request
	http       *http.Client
	tenants    []tenant
	runID      string
	seed       uint64
	clients    int
	total      int
	rate       float64
	opDeadline time.Duration

	slots  atomic.Int64
	bursts atomic.Int64
	stats  loadStats

	mu  sync.Mutex
	ops []*op
}

func newLoadGen(bases []string, tenants []tenant, runID string, seed uint64, p profile) *loadGen {
	tr := &http.Transport{
		Proxy:       nil,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		// A new connection per request: with keep-alive, net/http itself
		// resends a request carrying Idempotency-Key when a reused
		// connection breaks, and the suite would not see that attempt.
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	trimmed := make([]string, len(bases))
	for i, b := range bases {
		trimmed[i] = strings.TrimRight(b, "/")
	}
	return &loadGen{bases: trimmed, http: &http.Client{Transport: tr}, tenants: tenants,
		runID: runID, seed: seed, clients: p.Clients, total: p.Ops, rate: p.Rate, opDeadline: p.OpDeadline,
		stats: loadStats{status: map[int]int64{}}}
}

// Run runs every client until the operations are used up.
func (l *loadGen) Run(ctx context.Context) {
	start := time.Now()
	var wg sync.WaitGroup
	for c := range l.clients {
		wg.Go(func() { l.client(ctx, c, start) })
	}
	wg.Wait()
}

// Ops returns every operation so far.
func (l *loadGen) Ops() []*op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*op(nil), l.ops...)
}

// Done returns how many operations have been started.
func (l *loadGen) Done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ops)
}

// The load's mix, for a client with live notes: updateShare of its
// operations update one (raceShare of those are a race of two agents,
// staleShare made against an older version, unchangedShare setting what
// the note holds, goneShare of a note it deleted), deleteShare delete
// one, the rest create. A client's first operation is a create, so about
// 28 % of all operations are updates.
const (
	updateShare    = 0.27
	deleteShare    = 0.22
	raceShare      = 0.12
	staleShare     = 0.06
	unchangedShare = 0.05
	goneShare      = 0.04
	// reupdateShare of the updates refused with 412 are followed, after
	// the client read the note again, by an update from the version it
	// read: a new intent under a new key, never the refused one resent.
	reupdateShare = 0.5
)

// Faulted reports whether a request of o went without a decided answer
// (a dropped response, a killed API, 409, 5xx).
func (o *op) Faulted() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.undecided) > 0
}

// known is what a client knows of one of its notes: the version it last
// saw and the note's fields at that version. Only its client writes a
// note, so the knowledge is certain unless an operation on the note
// ended without a decided answer (it may or may not have executed) and
// no read followed.
type known struct {
	id, createTitle string
	version         int
	title, body     string
	certain         bool
}

// learn takes the note an answer or a read carried.
func (k *known) learn(n noteBody) {
	k.version, k.title, k.body, k.certain = n.Version, n.Title, n.Body, true
}

// noteBody is the part of a note (an answer's body, a read) the load and
// the checks look at.
type noteBody struct {
	ID        string `json:"id"`
	Title     string `json:"title"`
	Body      string `json:"body"`
	CreatedAt string `json:"created_at"`
	Version   int    `json:"version"`
	UpdatedAt string `json:"updated_at"`
}

func parseNote(b []byte) (noteBody, bool) {
	var n noteBody
	if json.Unmarshal(b, &n) != nil || n.ID == "" || n.Version == 0 {
		return noteBody{}, false
	}
	return n, true
}

func (l *loadGen) client(ctx context.Context, c int, start time.Time) {
	rng := rand.New(rand.NewPCG(l.seed, uint64(c)+1))
	t := l.tenants[c%len(l.tenants)]
	var live, deleted []*known
	var reupdate *known // to update again from the version read after a 412
	for seq := 0; ; seq++ {
		slot := l.slots.Add(1) - 1
		if slot >= int64(l.total) {
			return
		}
		due := start.Add(time.Duration(float64(slot) / l.rate * float64(time.Second)))
		if !wait.For(ctx, time.Until(due)) {
			return
		}
		var (
			o *op
			k *known
		)
		r := rng.Float64()
		switch {
		case reupdate != nil:
			k, reupdate = reupdate, nil
			o = l.newUpdate(rng, c, seq, -1, t, k, expectUpdated)
			o.After412 = true
		case len(live) > 0 && r < updateShare:
			k = live[rng.IntN(len(live))]
			switch r := rng.Float64(); {
			case r < raceShare:
				if l.race(ctx, rng, c, seq, t, k) {
					reupdate = k
				}
				continue
			case r < raceShare+staleShare && k.certain && k.version > 1:
				o = l.newUpdate(rng, c, seq, -1, t, k, expectStale)
			case r < raceShare+staleShare+unchangedShare && k.certain:
				o = l.newUpdate(rng, c, seq, -1, t, k, expectUnchanged)
			case r < raceShare+staleShare+unchangedShare+goneShare && len(deleted) > 0:
				k = deleted[rng.IntN(len(deleted))]
				o = l.newUpdate(rng, c, seq, -1, t, k, expectGone)
			case k.certain:
				o = l.newUpdate(rng, c, seq, -1, t, k, expectUpdated)
			default:
				o = l.newUpdate(rng, c, seq, -1, t, k, expectEither)
			}
		case len(live) > 0 && r < updateShare+deleteShare:
			o = &op{Kind: opDelete, Client: c, Tenant: t.Name, token: t.Token,
				Key: fmt.Sprintf("e2e-%s-d%d-%d", l.runID, c, seq)}
			if len(deleted) > 0 && rng.Float64() < 0.15 {
				o.NoteID, o.ExpectStatus = deleted[rng.IntN(len(deleted))].id, http.StatusNotFound
			} else {
				i := rng.IntN(len(live))
				k = live[i]
				o.NoteID, o.ExpectStatus = k.id, http.StatusOK
				if k.certain && rng.IntN(2) == 0 {
					o.IfMatch = k.version
				}
				// Whatever the answer, the note is no longer surely live.
				live = append(live[:i], live[i+1:]...)
			}
		default:
			o = l.newCreate(rng, c, seq, t)
		}
		l.start(ctx, o, rng)
		a := o.Decided()
		switch {
		case a == nil:
			if k != nil {
				k.certain = false
			}
		case o.Kind == opCreate && a.Status == http.StatusCreated:
			if n, ok := parseNote(a.Body); ok {
				o.mu.Lock()
				o.NoteID = n.ID
				o.mu.Unlock()
				k := &known{id: n.ID, createTitle: o.Title}
				k.learn(n)
				live = append(live, k)
			}
		case o.Kind == opDelete && a.Status == http.StatusOK && o.ExpectStatus == http.StatusOK:
			deleted = append(deleted, k)
		case o.Kind == opUpdate && o.Expect == expectGone:
		case o.Kind == opUpdate && a.Status == http.StatusOK:
			if n, ok := parseNote(a.Body); ok {
				k.learn(n)
			}
		case o.Kind == opUpdate && a.Status == http.StatusPreconditionFailed:
			// Another agent won, or the client's view was old: it reads
			// the note again and may decide to update it from there.
			if l.reread(ctx, t, k) && rng.Float64() < reupdateShare {
				reupdate = k
			}
		}
	}
}

// newUpdate makes an update of k's note made as expect says, by agent
// (-1: the client itself; 0 and 1: the agents of a race): the title
// ("<the create's title> · edit …", so that a note keeps naming its
// create), the body or both, each a value no update sent before — or,
// for expectUnchanged, what the note holds.
func (l *loadGen) newUpdate(rng *rand.Rand, c, seq, agent int, t tenant, k *known, expect string) *op {
	key := fmt.Sprintf("e2e-%s-u%d-%d", l.runID, c, seq)
	edit := fmt.Sprintf("edit %d/%d", c, seq)
	if agent >= 0 {
		key = fmt.Sprintf("e2e-%s-r%d-%d-a%d", l.runID, c, seq, agent)
		edit += fmt.Sprintf(" by agent %d", agent)
	}
	o := &op{Kind: opUpdate, Client: c, Tenant: t.Name, token: t.Token, Key: key, NoteID: k.id,
		IfMatch: k.version, Expect: expect}
	if k.certain {
		o.Known = k.version
	}
	title, body := k.createTitle+" · "+edit, edit+": "+words(rng, 1+rng.IntN(12))
	if expect == expectUnchanged {
		title, body = k.title, k.body
	}
	switch r := rng.Float64(); {
	case r < 0.4:
		o.SetTitle = &title
	case r < 0.8:
		o.SetBody = &body
	default:
		o.SetTitle, o.SetBody = &title, &body
	}
	if expect == expectStale {
		o.IfMatch = k.version - 1
	}
	req := map[string]string{}
	if o.SetTitle != nil {
		req["title"] = *o.SetTitle
	}
	if o.SetBody != nil {
		req["body"] = *o.SetBody
	}
	o.request, _ = json.Marshal(req)
	return o
}

// race runs two agents' updates of k's note from the version both read
// (the client reads it first when its view is uncertain), each with the
// schedule's resends but never impatient, at once; exactly one may win.
// Then the client reads the note, as the loser would; it reports whether
// the client updates the note again from there (a new intent).
func (l *loadGen) race(ctx context.Context, rng *rand.Rand, c, seq int, t tenant, k *known) bool {
	if !k.certain && !l.reread(ctx, t, k) {
		return false
	}
	a := l.newUpdate(rng, c, seq, 0, t, k, expectRace)
	b := l.newUpdate(rng, c, seq, 1, t, k, expectRace)
	a.Rival, b.Rival = b, a
	var wg sync.WaitGroup
	for _, o := range []*op{a, b} {
		orng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		l.prepare(o, orng)
		o.Impatient = false
		wg.Go(func() { l.run(ctx, o, orng) })
	}
	wg.Wait()
	return l.reread(ctx, t, k) && rng.Float64() < reupdateShare
}

// reread reads k's note (GET through the proxies, which never drop a
// read's response), retrying what is not an answer until opDeadline, and
// learns it; it reports whether it got the note.
func (l *loadGen) reread(ctx context.Context, t tenant, k *known) bool {
	deadline := time.Now().Add(l.opDeadline)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil && time.Now().Before(deadline) {
		base := l.bases[(l.next.Add(1)-1)%uint64(len(l.bases))]
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, base+"/v1/notes/"+k.id, nil)
		req.Header.Set("Authorization", "Bearer "+t.Token)
		l.stats.reads.Add(1)
		resp, err := l.http.Do(req)
		var body []byte
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		cancel()
		if err == nil && resp.StatusCode == http.StatusOK {
			if n, ok := parseNote(body); ok && resp.Header.Get("ETag") == etagOf(n.Version) {
				k.learn(n)
				return true
			}
		}
		if err == nil && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			break // an answer, but not the note: the checks will tell
		}
		if !wait.For(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	k.certain = false
	return false
}

// etagOf is the ETag of a note at version.
func etagOf(version int) string { return `"` + strconv.Itoa(version) + `"` }

// Burst runs n creates outside the schedule, workers at a time (split
// between the tenants: keep it under QUILL_TENANT_CONCURRENCY), with the
// schedule's resends and impatience; each burst's clients have numbers of
// their own, so keys and titles stay unique. started counts the creates
// begun; done is closed when all have ended.
func (l *loadGen) Burst(ctx context.Context, n, workers int) (started *atomic.Int64, done <-chan struct{}) {
	id := int(l.bursts.Add(1))
	started = new(atomic.Int64)
	ch := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := 1000*id + w
			rng := rand.New(rand.NewPCG(l.seed, uint64(c)+1))
			t := l.tenants[w%len(l.tenants)]
			for seq := 0; started.Add(1) <= int64(n); seq++ {
				o := l.newCreate(rng, c, seq, t)
				l.start(ctx, o, rng)
			}
		})
	}
	go func() { wg.Wait(); close(ch) }()
	return started, ch
}

// resendShare is the share of operations sent more than once under their
// key; impatientShare the share whose client gives up early.
const (
	resendShare    = 0.2
	impatientShare = 0.03
)

func noteIDOf(body []byte) string {
	var n struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &n)
	return n.ID
}

// newCreate makes a create operation: title "e2e <key>" (so a note names
// its operation), a short body, and a PNG (40 %), a text (40 %) or nothing.
func (l *loadGen) newCreate(rng *rand.Rand, c, seq int, t tenant) *op {
	key := fmt.Sprintf("e2e-%s-c%d-%d", l.runID, c, seq)
	o := &op{Kind: opCreate, Client: c, Tenant: t.Name, token: t.Token, Key: key, Title: "e2e " + key}
	req := map[string]any{"title": o.Title, "body": fmt.Sprintf("client %d, operation %d, %s", c, seq, words(rng, 1+rng.IntN(12)))}
	var data []byte
	switch r := rng.Float64(); {
	case r < 0.4:
		o.Att, data = attPNG, randomPNG(rng)
		req["attachment"] = map[string]string{"filename": fmt.Sprintf("pic-%d.png", seq), "content_type": "image/png",
			"data": base64.StdEncoding.EncodeToString(data)}
	case r < 0.8:
		var text string
		o.Att, text, o.Lines, o.Words = attText, "", 0, 0
		for range 1 + rng.IntN(20) {
			n := 1 + rng.IntN(12)
			text += words(rng, n) + "\n"
			o.Lines++
			o.Words += n
		}
		data = []byte(text)
		req["attachment"] = map[string]string{"filename": fmt.Sprintf("notes-%d.txt", seq), "content_type": "text/plain",
			"data": base64.StdEncoding.EncodeToString(data)}
	default:
		o.Att = attNone
	}
	if data != nil {
		sum := sha256.Sum256(data)
		o.AttSHA = hex.EncodeToString(sum[:])
	}
	o.request, _ = json.Marshal(req)
	return o
}

func words(rng *rand.Rand, n int) string {
	w := make([]string, n)
	for i := range w {
		b := make([]byte, 1+rng.IntN(8))
		for j := range b {
			b[j] = byte('a' + rng.IntN(26))
		}
		w[i] = string(b)
	}
	return strings.Join(w, " ")
}

// randomPNG draws a small image (4–48 px a side) of a few rectangles.
func randomPNG(rng *rand.Rand) []byte {
	w, h := 4+rng.IntN(45), 4+rng.IntN(45)
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for range 1 + rng.IntN(4) {
		c := color.NRGBA{uint8(rng.IntN(256)), uint8(rng.IntN(256)), uint8(rng.IntN(256)), 255}
		x0, y0 := rng.IntN(w), rng.IntN(h)
		x1, y1 := x0+1+rng.IntN(w-x0), y0+1+rng.IntN(h-y0)
		for y := y0; y < y1; y++ {
			for x := x0; x < x1; x++ {
				img.SetNRGBA(x, y, c)
			}
		}
	}
	var b bytes.Buffer
	_ = png.Encode(&b, img)
	return b.Bytes()
}

// start draws how o is delivered (resends, concurrency, patience), records
// it and runs it.
func (l *loadGen) start(ctx context.Context, o *op, rng *rand.Rand) {
	l.prepare(o, rng)
	l.run(ctx, o, rng)
}

// prepare draws how o is delivered and records it.
func (l *loadGen) prepare(o *op, rng *rand.Rand) {
	o.Copies = 1
	if rng.Float64() < resendShare {
		o.Copies = 2 + rng.IntN(4)
		o.Concurrent = rng.IntN(2) == 0
	}
	o.Impatient = rng.Float64() < impatientShare
	l.mu.Lock()
	l.ops = append(l.ops, o)
	l.mu.Unlock()
}

// run sends o's copies, at once or one after the other.
func (l *loadGen) run(ctx context.Context, o *op, rng *rand.Rand) {
	if o.Concurrent {
		var wg sync.WaitGroup
		for i := range o.Copies {
			seed := rng.Uint64()
			wg.Go(func() { l.sendUntilDecided(ctx, o, i, seed) })
		}
		wg.Wait()
		return
	}
	for i := range o.Copies {
		if i > 0 && !wait.For(ctx, time.Duration(rng.IntN(300))*time.Millisecond) {
			return
		}
		if !l.sendUntilDecided(ctx, o, i, rng.Uint64()) {
			return
		}
	}
}

// sendUntilDecided sends one copy of o until it gets a decided answer
// (2xx, or a 4xx other than 409 and 429), retrying with the same key after
// transport errors, 409, 429 and 5xx with a jittered backoff and Retry-After. It
// reports false when opDeadline passed first.
func (l *loadGen) sendUntilDecided(ctx context.Context, o *op, copyIdx int, seed uint64) bool {
	rng := rand.New(rand.NewPCG(seed, uint64(copyIdx)))
	deadline := time.Now().Add(l.opDeadline)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil && time.Now().Before(deadline) {
		a, kind, retryAfter := l.send(ctx, o)
		o.record(kind, a)
		if a != nil {
			return true
		}
		if o.Impatient {
			break
		}
		pause := time.Duration(rng.Int64N(int64(backoff))) + backoff/2
		pause = max(pause, retryAfter)
		backoff = min(2*backoff, 2*time.Second)
		if !wait.For(ctx, pause) {
			break
		}
	}
	o.mu.Lock()
	o.gaveUp++
	o.mu.Unlock()
	return false
}

// send sends one request of o and classifies the outcome: a decided
// answer, or the kind of undecided outcome and the Retry-After.
func (l *loadGen) send(ctx context.Context, o *op) (*answer, string, time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	base := l.bases[(l.next.Add(1)-1)%uint64(len(l.bases))]
	var req *http.Request
	switch o.Kind {
	case opCreate:
		req, _ = http.NewRequestWithContext(rctx, http.MethodPost, base+"/v1/notes", bytes.NewReader(o.request))
		req.Header.Set("Content-Type", "application/json")
	case opUpdate:
		req, _ = http.NewRequestWithContext(rctx, http.MethodPatch, base+"/v1/notes/"+o.NoteID, bytes.NewReader(o.request))
		req.Header.Set("Content-Type", "application/json")
	default:
		req, _ = http.NewRequestWithContext(rctx, http.MethodDelete, base+"/v1/notes/"+o.NoteID, nil)
	}
	if o.IfMatch > 0 {
		req.Header.Set("If-Match", etagOf(o.IfMatch))
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	req.Header.Set("Idempotency-Key", o.Key)
	l.stats.requests.Add(1)
	resp, err := l.http.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		l.stats.transport.Add(1)
		return nil, "transport", 0
	}
	l.stats.mu.Lock()
	l.stats.status[resp.StatusCode]++
	l.stats.mu.Unlock()
	// 429 too: the tenant's limit refused it and nothing was executed
	// (SPEC §3: retry same_key) — under the soak's load, with resends of
	// one key in flight at once and PostgreSQL restarting, a tenant's
	// requests in flight can pass QUILL_TENANT_CONCURRENCY.
	if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return nil, "http_" + strconv.Itoa(resp.StatusCode), time.Duration(ra) * time.Second
	}
	return &answer{Status: resp.StatusCode, ETag: resp.Header.Get("ETag"), Body: body,
		Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, "", 0
}
