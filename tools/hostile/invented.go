package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Invented methods, as in issue 24's security review: a method the caller
// made up became a label value, so every fresh one was a series kept for
// the process's life, and a long one (`AAAA…(60 KB)…N /v1/notes`) tens of
// KiB of it.
const (
	// inventedInFlight bounds the invented-method requests awaiting an
	// answer, as badTokenInFlight does.
	inventedInFlight = 64
	// inventedLongBytes is a long method's length: under the servers'
	// 64 KiB header limit with the rest of the request, so that it is
	// routed and answered rather than refused 431 before any label.
	inventedLongBytes = 60 << 10
	// inventedLongEvery: one method in this many is a long one.
	inventedLongEvery = 4
	// inventedShortMin and inventedShortMax bound a short method's
	// length; longer than any standard method (OPTIONS and CONNECT have
	// 7), so that no invented one is a method the API routes.
	inventedShortMin, inventedShortMax = 8, 24
	// tokenChars are RFC 9110's token characters, of which a method is
	// made.
	tokenChars = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// inventedMethod is the i-th invented method drawn from rng: each
// inventedLongEvery-th inventedLongBytes long, the others 8-24 token
// characters; all fresh (random) and none a method the API routes.
func inventedMethod(rng *rand.Rand, i int) string {
	n := inventedShortMin + rng.IntN(inventedShortMax-inventedShortMin+1)
	if i%inventedLongEvery == 0 {
		n = inventedLongBytes
	}
	var b strings.Builder
	b.Grow(n)
	for range n {
		b.WriteByte(tokenChars[rng.IntN(len(tokenChars))])
	}
	return b.String()
}

// inventedPath is the i-th request's path: every other one /v1/notes (a
// routed pattern, where the method is the only thing invented), the others
// a path no route matches.
func inventedPath(rng *rand.Rand, i int) string {
	if i%2 == 0 {
		return notesPath
	}
	return "/invented/" + strconv.FormatUint(rng.Uint64(), 36)
}

// inventedMethods sends cfg.inventedRate requests a second, each with a
// fresh invented method and no token, to /v1/notes and unmatched paths.
// net/http's client sends any method made of token characters as it is.
func inventedMethods(ctx context.Context, cfg config) rateStats {
	hc := newHTTPClient(cfg.dialer(fromInvented), inventedInFlight, cfg.timeout)
	defer hc.CloseIdleConnections()
	base := strings.TrimRight(cfg.url, "/")
	var (
		mu  sync.Mutex
		rng = rand.New(rand.NewPCG(cfg.seed, uint64(fromInvented)))
		seq int
	)
	return atRate(ctx, cfg.inventedRate, inventedInFlight, func(ctx context.Context) string {
		mu.Lock()
		i := seq
		seq++
		method, path := inventedMethod(rng, i), inventedPath(rng, i)
		mu.Unlock()
		req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
		if err != nil {
			return "refused_by_client"
		}
		return do(hc, req).kind()
	})
}
