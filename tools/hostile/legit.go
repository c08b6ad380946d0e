package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/wait"
)

// legitTitlePrefix starts every legitimate note's title, followed by its
// Idempotency-Key: PostgreSQL's notes then tell, key by key, how many notes
// each operation made, independently of the operation records.
const legitTitlePrefix = "legit "

// legitOp is one legitimate create: its key, whether it carries the PNG,
// and what it was answered. The body is built again for every send, from
// these: a run keeps tens of thousands of operations, and half of the
// bodies are 87 KB.
type legitOp struct {
	key    string
	attach bool
	// acked: some attempt was answered 2xx, naming noteID.
	acked  bool
	noteID string
}

// legitPhase is what the legitimate clients measured in one phase.
type legitPhase struct {
	// Lat holds every measured operation's time from its first attempt to
	// its 2xx (retries included); an operation without a 2xx by the end
	// of the phase counts with the time it took until it was given up.
	Lat      []time.Duration
	Done     int // measured operations answered 2xx
	Creates  int // measured create operations
	Resends  int // measured resend operations
	Failed   int // operations (measured or not) given up at the end of the phase
	Rejected int // operations answered a 4xx that a retry cannot fix (a bug)
	// NotReplayed and OtherNote count resends answered 2xx without
	// Idempotent-Replayed: true, or naming another note than the first.
	NotReplayed, OtherNote int
	// Requests counts every request of the phase by answer kind.
	Requests counts
	WindowS  float64
}

// legit is the legitimate workload: clients creating notes, some with the
// 64 KiB PNG of the worker benchmark, some of them sent again.
type legit struct {
	cfg      config
	hc       *http.Client
	endpoint string
	auths    []string // client w sends auths[w % len]
	attach   string
	filler   string
	// ops[w] are client w's operations over all phases, so later phases
	// resend earlier phases' notes too and the check covers all of them.
	ops [][]*legitOp
	// acked[w]: client w's answered creates, the ones it may resend.
	acked [][]*legitOp
}

func newLegit(cfg config) *legit {
	return &legit{
		cfg: cfg, hc: newHTTPClient(cfg.dialer(fromLegit), cfg.legitClients, cfg.timeout),
		endpoint: cfg.notesURL(), auths: bearers(cfg.legitTokens),
		attach: fmt.Sprintf(`,"attachment":{"filename":"legit.png","content_type":"image/png","data":"%s"}`,
			base64.StdEncoding.EncodeToString(attachment.BenchFixturePNG64K())),
		filler: "a note an agent writes, and perhaps writes again when it is unsure the first one landed",
		ops:    make([][]*legitOp, cfg.legitClients),
		acked:  make([][]*legitOp, cfg.legitClients),
	}
}

// bearers is the Authorization values of toks.
func bearers(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = "Bearer " + t
	}
	return out
}

// newOp is client w's next create.
func (l *legit) newOp(phase string, w, seq int, withAttachment bool) *legitOp {
	return &legitOp{key: l.cfg.runID + "-" + phase + "-" + strconv.Itoa(w) + "-" + strconv.Itoa(seq), attach: withAttachment}
}

// body is op's request body, the same bytes at every send; titles and keys
// need no JSON escaping.
func (l *legit) body(op *legitOp) []byte {
	b := `{"title":"` + legitTitlePrefix + op.key + `","body":"` + l.filler + `"`
	if op.attach {
		b += l.attach
	}
	return []byte(b + "}")
}

// send sends op until an attempt is answered 2xx, a 4xx that no retry
// fixes, or the next attempt would start after until; it returns the last
// answer and counts every attempt in reqs.
func (l *legit) send(ctx context.Context, w int, op *legitOp, until time.Time, reqs counts) answer {
	body := l.body(op)
	auth := l.auths[w%len(l.auths)]
	for {
		a := post(ctx, l.hc, l.endpoint, auth, op.key, body)
		reqs[a.kind()]++
		if a.kind() == "2xx" || !a.retryable() || ctx.Err() != nil {
			return a
		}
		p := a.pause()
		if time.Now().Add(p).After(until) || !wait.For(ctx, p) {
			return a
		}
	}
}

// run drives the clients for warmup + duration from now and returns the
// phase's figures.
func (l *legit) run(ctx context.Context, phase string) legitPhase {
	start := time.Now()
	measureFrom := start.Add(l.cfg.warmup)
	end := measureFrom.Add(l.cfg.duration)
	per := make([]legitPhase, l.cfg.legitClients)
	var wg sync.WaitGroup
	for w := range l.cfg.legitClients {
		wg.Go(func() {
			st := &per[w]
			st.Requests = counts{}
			rng := rand.New(rand.NewPCG(l.cfg.seed, uint64(w)<<8|uint64(phase[0])))
			for seq := 0; ; seq++ {
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					return
				}
				measured := !t0.Before(measureFrom)
				op, resend := (*legitOp)(nil), false
				if n := len(l.acked[w]); n > 0 && rng.Float64() < l.cfg.resendShare {
					op, resend = l.acked[w][rng.IntN(n)], true
				} else {
					op = l.newOp(phase, w, seq, rng.Float64() < l.cfg.attachShare)
					l.ops[w] = append(l.ops[w], op)
				}
				a := l.send(ctx, w, op, end, st.Requests)
				d := time.Since(t0)
				ok := a.kind() == "2xx"
				switch {
				case ok && resend:
					if !a.replayed {
						st.NotReplayed++
					}
					if a.noteID != op.noteID {
						st.OtherNote++
					}
				case ok && !op.acked:
					op.acked, op.noteID = true, a.noteID
					l.acked[w] = append(l.acked[w], op)
				case !ok && a.retryable():
					st.Failed++
				case !ok:
					st.Rejected++
				}
				if l.cfg.legitThink > 0 {
					select {
					case <-time.After(l.cfg.legitThink):
					case <-ctx.Done():
					}
				}
				if !measured || ctx.Err() != nil {
					continue
				}
				st.Lat = append(st.Lat, d)
				if ok {
					st.Done++
				}
				if resend {
					st.Resends++
				} else {
					st.Creates++
				}
			}
		})
	}
	wg.Wait()
	res := legitPhase{Requests: counts{}, WindowS: measure.Round(time.Since(measureFrom).Seconds(), 3)}
	for _, st := range per {
		res.Lat = append(res.Lat, st.Lat...)
		res.Done += st.Done
		res.Creates += st.Creates
		res.Resends += st.Resends
		res.Failed += st.Failed
		res.Rejected += st.Rejected
		res.NotReplayed += st.NotReplayed
		res.OtherNote += st.OtherNote
		res.Requests.add(st.Requests)
	}
	return res
}

// recover sends every create without a 2xx again, as an agent would under
// the same key, until each is answered or until has passed; it returns how
// many were answered now and how many still are not.
func (l *legit) recover(ctx context.Context, until time.Time) (recovered, unresolved int) {
	reqs := counts{}
	for w, ops := range l.ops {
		for _, op := range ops {
			if op.acked {
				continue
			}
			// Checked before each send too: with an API that answers
			// nothing, every attempt takes the whole request timeout.
			if !time.Now().Before(until) {
				unresolved++
				continue
			}
			if a := l.send(ctx, w, op, until, reqs); a.kind() == "2xx" {
				op.acked, op.noteID = true, a.noteID
				recovered++
			} else {
				unresolved++
			}
		}
	}
	return recovered, unresolved
}

// keyNotes is, per legitimate key, the ids of the notes whose title names it.
type keyNotes map[string][]string

// integrity is the check of the legitimate operations against PostgreSQL.
type integrity struct {
	Keys  int // distinct legitimate keys sent
	Acked int // of them, answered 2xx (after the recovery)
	// Lost: keys answered 2xx whose note is not in PostgreSQL.
	Lost int
	// Duplicated: keys with more than one note.
	Duplicated int
	// Unresolved: keys never answered 2xx, even by the recovery.
	Unresolved int
	// Strays: the legitimate tenant's notes that no key of this run made.
	Strays int
}

// check compares the operations' answers with the notes found.
func check(ops [][]*legitOp, found keyNotes, strays int) integrity {
	in := integrity{Strays: strays}
	for _, list := range ops {
		for _, op := range list {
			in.Keys++
			ids := found[op.key]
			if len(ids) > 1 {
				in.Duplicated++
			}
			if !op.acked {
				in.Unresolved++
				continue
			}
			in.Acked++
			if !containsID(ids, op.noteID) {
				in.Lost++
			}
		}
	}
	return in
}

func containsID(ids []string, id string) bool {
	for _, v := range ids {
		if v == id {
			return true
		}
	}
	return false
}
