package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillhq/quill/internal/wait"
)

// idleRedialPause is how long a place of the idle host waits, after the
// server closed or refused its connection, before it opens the next: the
// host wants its connections back, but a place redialling at once would
// spin on the server's refusals and take the CPU the other attackers'
// process is held to.
const idleRedialPause = time.Second

// idleTarget is a server the idle host holds connections to.
type idleTarget struct {
	name string // "api" or "admin", for the report
	addr string // host:port
	path string // the one request of a keep-alive connection
}

// idleStats is what the idle host's connections to one server saw.
type idleStats struct {
	Target string `json:"target"`
	Places int    `json:"places"`
	// Opened counts the connections made, DialErrs the dials that failed.
	Opened, DialErrs int
	// Refused: answered 503 and closed (the address past its share).
	Refused int
	// Closed: closed by the server otherwise (to make room for another
	// connection, or timed out), after an answer or none.
	Closed int
	// Answers: the keep-alive connections' one request, by answer kind
	// (the 503 refusals are in Refused).
	Answers counts
	// OpenAtEnd: still open when the phase ended; MaxOpen: the most open
	// at once, as the host saw it.
	OpenAtEnd, MaxOpen int
}

// idleHost holds n connections to each target, made by d, until ctx
// ends: half of them send one request and then keep the connection idle
// as a keep-alive, the others send nothing at all. A connection the
// server closes or refuses is opened again after idleRedialPause.
func idleHost(ctx context.Context, d *net.Dialer, targets []idleTarget, n int) []idleStats {
	res := make([]idleStats, len(targets))
	var wg sync.WaitGroup
	for ti, t := range targets {
		wg.Go(func() { res[ti] = idleConns(ctx, d, t, n) })
	}
	wg.Wait()
	return res
}

// idleConns is idleHost for one target.
func idleConns(ctx context.Context, d *net.Dialer, t idleTarget, n int) idleStats {
	per := make([]idleStats, n)
	var open, maxOpen atomic.Int64
	req := fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: hostile-idle\r\n\r\n", t.path, t.addr)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			st := &per[i]
			st.Answers = counts{}
			keepAlive := i%2 == 0
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", t.addr)
				if err != nil {
					if ctx.Err() == nil {
						st.DialErrs++
						wait.For(ctx, redialPause)
					}
					continue
				}
				st.Opened++
				if o := open.Add(1); o > maxOpen.Load() {
					maxOpen.Store(o) // racy max: a report figure, not a bound
				}
				stop := context.AfterFunc(ctx, func() { c.Close() })
				code := ""
				if !keepAlive {
					code = readStatus(c)
				} else if _, err := c.Write(req); err == nil {
					code = readStatus(c)
				}
				stop()
				c.Close()
				open.Add(-1)
				switch idleOutcome(code, ctx.Err() != nil) {
				case refused:
					st.Refused++
				case openAtEnd:
					st.OpenAtEnd++
				default:
					st.Closed++
				}
				if keepAlive && code != "" && code != "503" {
					st.Answers[answerKind(code)]++
				}
				if ctx.Err() != nil {
					return
				}
				wait.For(ctx, idleRedialPause)
			}
		})
	}
	wg.Wait()
	res := idleStats{Target: t.name, Places: n, Answers: counts{}, MaxOpen: int(maxOpen.Load())}
	for _, st := range per {
		res.Opened += st.Opened
		res.DialErrs += st.DialErrs
		res.Refused += st.Refused
		res.Closed += st.Closed
		res.OpenAtEnd += st.OpenAtEnd
		res.Answers.add(st.Answers)
	}
	return res
}

// How an idle connection ended.
const (
	refused   = "refused"     // answered 503 and closed: past the share
	openAtEnd = "open at end" // still open when the phase ended
	closed    = "closed"      // closed by the server otherwise
)

// idleOutcome classifies an idle connection by the status line the
// server wrote first ("" for none) and whether the phase was over when it
// ended: a 503 is a refusal whenever it came, a connection the phase's end
// closed was still open, any other end was the server's doing.
func idleOutcome(code string, phaseOver bool) string {
	switch {
	case code == "503":
		return refused
	case phaseOver:
		return openAtEnd
	}
	return closed
}

// answerKind is a status code's kind, as answer.kind names it.
func answerKind(code string) string {
	if len(code) == 3 && code[0] == '2' {
		return "2xx"
	}
	return "http_" + code
}
