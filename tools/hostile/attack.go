package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillhq/quill/internal/measure"
	"github.com/quillhq/quill/internal/wait"
)

// Attack constants; the load figures themselves are settings.
const (
	// slowlorisLength is the body a slowloris connection announces and
	// never sends.
	slowlorisLength = 100000
	// badTokenInFlight bounds the bad-token requests awaiting an answer:
	// a slot that finds all taken is skipped and counted, so a slow API
	// shows as skipped sends rather than as the tool's memory growing.
	badTokenInFlight = 256
	// bombInFlight bounds the bomb uploads awaiting an answer, likewise.
	bombInFlight = 16
	// redialPause is the wait after a refused connection.
	redialPause = 100 * time.Millisecond
)

// lorisStats is what the slowloris connections saw.
type lorisStats struct {
	Conns     int // connections opened
	DialErrs  int // connections refused or timed out
	Closed    int // closed by the server during the phase
	OpenAtEnd int // still open when the phase ended
	// Lifetimes of the connections the server closed.
	Lifetimes []time.Duration
	// Answers: the status lines the server wrote before closing, by code.
	Answers counts
}

// slowloris keeps n connections to addr open, made by d, each announcing
// a body of slowlorisLength bytes after headers without a token and then
// sending nothing, until ctx ends; a connection the server closes is
// replaced.
func slowloris(ctx context.Context, d *net.Dialer, addr string, n int) lorisStats {
	per := make([]lorisStats, n)
	var wg sync.WaitGroup
	head := fmt.Sprintf("POST /v1/notes HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nIdempotency-Key: loris\r\nContent-Length: %d\r\n\r\n", addr, slowlorisLength)
	for i := range n {
		wg.Go(func() {
			st := &per[i]
			st.Answers = counts{}
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					if ctx.Err() == nil {
						st.DialErrs++
						wait.For(ctx, redialPause)
					}
					continue
				}
				st.Conns++
				t0 := time.Now()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				_, err = c.Write([]byte(head))
				var code string
				if err == nil {
					code = readStatus(c)
				}
				stop()
				c.Close()
				if ctx.Err() != nil {
					st.OpenAtEnd++
					return
				}
				st.Closed++
				st.Lifetimes = append(st.Lifetimes, time.Since(t0))
				if code != "" {
					st.Answers["http_"+code]++
				}
			}
		})
	}
	wg.Wait()
	res := lorisStats{Answers: counts{}}
	for _, st := range per {
		res.Conns += st.Conns
		res.DialErrs += st.DialErrs
		res.Closed += st.Closed
		res.OpenAtEnd += st.OpenAtEnd
		res.Lifetimes = append(res.Lifetimes, st.Lifetimes...)
		res.Answers.add(st.Answers)
	}
	slices.Sort(res.Lifetimes)
	return res
}

// readStatus reads from c until it is closed and returns the status code
// of the first status line the server wrote ("" if none).
func readStatus(c net.Conn) string {
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	code := ""
	if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") {
		code = f[1]
	}
	for err == nil {
		_, err = br.Discard(4096)
		if err == bufio.ErrBufferFull {
			err = nil
		}
	}
	return code
}

// rateStats is what an open-loop sender (bad tokens, bombs) saw.
type rateStats struct {
	Sent    int    // requests sent
	Skipped int    // slots skipped: every in-flight place was taken
	Answers counts // by kind
}

// atRate calls send rate times a second, on a fixed schedule from now
// until ctx ends, with at most inFlight calls running; a slot that finds
// them all running is skipped.
func atRate(ctx context.Context, rate float64, inFlight int, send func(context.Context) string) rateStats {
	var (
		mu  sync.Mutex
		st  = rateStats{Answers: counts{}}
		wg  sync.WaitGroup
		sem = make(chan struct{}, inFlight)
	)
	start := time.Now()
	for i := 0; ; i++ {
		due := start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
		if !wait.For(ctx, time.Until(due)) {
			break
		}
		select {
		case sem <- struct{}{}:
		default:
			st.Skipped++
			continue
		}
		st.Sent++
		wg.Go(func() {
			defer func() { <-sem }()
			k := send(ctx)
			if ctx.Err() != nil {
				return // cut off by the phase's end: not an answer
			}
			mu.Lock()
			st.Answers[k]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return st
}

// badToken returns a random token of the right form (qt_, 8 hex, _, 43
// base64url characters) that no tenant holds.
func badToken() string {
	var p [4]byte
	var s [32]byte
	_, _ = rand.Read(p[:])
	_, _ = rand.Read(s[:])
	return "qt_" + hex.EncodeToString(p[:]) + "_" + base64.RawURLEncoding.EncodeToString(s[:])
}

// badTokens lists notes with a fresh random token rate times a second.
func badTokens(ctx context.Context, cfg config) rateStats {
	hc := newHTTPClient(cfg.dialer(fromBadTokens), badTokenInFlight, cfg.timeout)
	defer hc.CloseIdleConnections()
	u := cfg.notesURL() + "?limit=1"
	return atRate(ctx, cfg.badTokenRate, badTokenInFlight, func(ctx context.Context) string {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return "transport"
		}
		req.Header.Set("Authorization", "Bearer "+badToken())
		return do(hc, req).kind()
	})
}

// bombs uploads a note with the bomb as its attachment rate times a
// second, with the bomb tenant's token.
func bombs(ctx context.Context, cfg config, bomb []byte) rateStats {
	hc := newHTTPClient(cfg.dialer(fromBombs), bombInFlight, cfg.timeout)
	defer hc.CloseIdleConnections()
	head := `{"title":"bomb","attachment":{"filename":"bomb.png","content_type":"image/png","data":"`
	data := base64.StdEncoding.EncodeToString(bomb)
	var seq atomic.Int64
	return atRate(ctx, cfg.bombRate, bombInFlight, func(ctx context.Context) string {
		key := cfg.runID + "-bomb-" + strconv.FormatInt(seq.Add(1), 10)
		return post(ctx, hc, cfg.notesURL(), "Bearer "+cfg.bombToken, key, []byte(head+data+`"}}`)).kind()
	})
}

// floodStats is what the flooding tenant's clients saw.
type floodStats struct {
	Requests int
	Answers  counts
}

// flood runs n clients of the flooding tenant, each creating a note as
// soon as its previous create was answered, until ctx ends.
func flood(ctx context.Context, cfg config, n int) floodStats {
	hc := newHTTPClient(cfg.dialer(fromFlood), n, cfg.timeout)
	defer hc.CloseIdleConnections()
	per := make([]counts, n)
	body := []byte(`{"title":"flood","body":"one tenant asking for far more than its share"}`)
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			per[w] = counts{}
			for seq := 0; ctx.Err() == nil; seq++ {
				key := cfg.runID + "-flood-" + strconv.Itoa(w) + "-" + strconv.Itoa(seq)
				a := post(ctx, hc, cfg.notesURL(), "Bearer "+cfg.floodToken, key, body)
				if ctx.Err() != nil {
					return // cut off by the phase's end: not an answer
				}
				per[w][a.kind()]++
				if a.kind() != "2xx" {
					wait.For(ctx, cfg.floodPause)
				}
			}
		})
	}
	wg.Wait()
	res := floodStats{Answers: counts{}}
	for _, c := range per {
		res.Answers.add(c)
	}
	res.Requests = res.Answers.total()
	return res
}

// lifetimeSummary is the slowloris lifetimes' median and maximum.
func lifetimeSummary(sorted []time.Duration) (p50, maxS float64) {
	if len(sorted) == 0 {
		return 0, 0
	}
	return measure.Round(measure.Percentile(sorted, 50).Seconds(), 2), measure.Round(sorted[len(sorted)-1].Seconds(), 2)
}
