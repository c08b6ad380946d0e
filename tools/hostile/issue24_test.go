package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

// TestSources: each client has an address of its own, the legitimate
// clients 127.0.0.1, and a dialer is bound to it only when the servers are
// on IPv4 loopback.
func TestSources(t *testing.T) {
	t.Parallel()
	all := []source{fromLegit, fromSlowloris, fromBadTokens, fromFlood, fromBombs, fromInvented, fromIdle, fromProbe}
	seen := map[netip.Addr]bool{}
	for _, s := range all {
		a := s.addr()
		require.True(t, a.Is4() && a.IsLoopback(), a)
		require.False(t, seen[a], "two sources share %s", a)
		seen[a] = true
	}
	require.Equal(t, "127.0.0.1", fromLegit.addr().String())

	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"http://127.0.0.1:8080", true},
		{"http://127.3.4.5", true},
		{"https://127.0.0.1:443/x", true},
		{"http://localhost:8080", false}, // may be ::1
		{"http://[::1]:8080", false},
		{"http://10.0.0.7:8080", false},
		{"http://api.example:8080", false},
		{"::", false},
	} {
		require.Equal(t, tc.want, loopbackV4(tc.url), tc.url)
	}

	own := config{ownAddrs: true}
	la, ok := own.dialer(fromIdle).LocalAddr.(*net.TCPAddr)
	require.True(t, ok)
	require.Equal(t, "127.0.0.7:0", la.String())
	require.Nil(t, config{}.dialer(fromIdle).LocalAddr)
	require.Contains(t, sourcesLine(true), "idle host 127.0.0.7")
	require.Contains(t, sourcesLine(false), "one address")

	for in, want := range map[string]string{"http://127.0.0.1:8080": "127.0.0.1:8080", "http://127.0.0.1": "127.0.0.1:80",
		"https://127.0.0.1": "127.0.0.1:443", "http://[::1]:9": "[::1]:9"} {
		got, err := hostPort(in)
		require.NoError(t, err)
		require.Equal(t, want, got, in)
	}
}

// TestSourcesConnect: a dialer bound to a source reaches a server on
// 127.0.0.1 from that source's address (Linux routes 127.0.0.0/8 to lo).
func TestSourcesConnect(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		got <- host
	}))
	t.Cleanup(srv.Close)
	hc := newHTTPClient(config{ownAddrs: true}.dialer(fromFlood), 1, 5*time.Second)
	t.Cleanup(hc.CloseIdleConnections)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	require.Equal(t, "2xx", do(hc, req).kind())
	require.Equal(t, "127.0.0.4", <-got)
}

// TestInventedMethod: every method is a fresh token net/http's client
// sends as it is, none a method the API routes, one in four 60 KiB long;
// half the paths are /v1/notes and the others match no route.
func TestInventedMethod(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{}
	for i := range 400 {
		m := inventedMethod(rng, i)
		if i%inventedLongEvery == 0 {
			require.Len(t, m, inventedLongBytes)
		} else {
			require.GreaterOrEqual(t, len(m), inventedShortMin)
			require.LessOrEqual(t, len(m), inventedShortMax)
		}
		for _, c := range []byte(m) {
			require.Contains(t, tokenChars, string(c))
		}
		require.False(t, seen[m], "method %d repeats", i)
		seen[m] = true
		require.NotContains(t, boundedMethods, m)
		p := inventedPath(rng, i)
		if i%2 == 0 {
			require.Equal(t, notesPath, p)
		} else {
			require.True(t, strings.HasPrefix(p, "/invented/"), p)
		}
		_, err := http.NewRequest(m, "http://127.0.0.1"+p, nil)
		require.NoError(t, err, "net/http refuses method %d", i)
	}
}

// TestCountSeries: the two metrics' series are counted from what
// client_golang writes — a route pattern's braces, an escaped quote, a
// histogram's buckets counted once per label set — and the other metrics
// are ignored.
func TestCountSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: requestsMetric, Help: "h"}, []string{"route", "method", "code"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: durationMetric, Help: "h"}, []string{"route", "method"})
	other := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quill_other_total", Help: "h"}, []string{"method"})
	reg.MustRegister(reqs, dur, other)
	for _, l := range [][]string{{"/v1/notes", "POST", "201"}, {"/v1/notes", "POST", "429"}, {"/v1/notes/{id}", "GET", "200"},
		{"unmatched", "_OTHER", "404"}, {`odd"route,}`, "_OTHER", "401"}} {
		reqs.WithLabelValues(l...).Inc()
		dur.WithLabelValues(l[0], l[1]).Observe(0.01)
	}
	other.WithLabelValues("INVENTED").Inc()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)

	s := scrape(t.Context(), newHTTPClient(&net.Dialer{}, 1, 5*time.Second), srv.URL, 0)
	require.Empty(t, s.Err)
	require.Equal(t, 5, s.Requests)
	require.Equal(t, 4, s.Durations, "POST /v1/notes has two codes and one duration series")
	require.Equal(t, []string{"GET", "POST", "_OTHER"}, s.Methods())
	keys := sortedValues(s.keys)
	require.Contains(t, keys, `quill_http_requests_total{code="200",method="GET",route="/v1/notes/{id}"}`)
	require.Contains(t, keys, `quill_http_request_duration_seconds{method="_OTHER",route="odd\"route,}"}`)
	require.Empty(t, unbounded(s))

	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	bad := scrape(t.Context(), newHTTPClient(&net.Dialer{}, 1, 5*time.Second), notFound.URL, 0)
	require.Contains(t, bad.Err, "answered 404")

	for _, tc := range []struct {
		name, text string
		wantErr    bool
		requests   int
	}{
		{"no labels", requestsMetric + " 3\n", false, 1},
		{"comments and blanks", "# HELP x\n\n# TYPE x counter\n" + requestsMetric + `{method="GET"} 1` + "\n", false, 1},
		{"newline escape", requestsMetric + `{method="A\nB"} 1`, false, 1},
		{"unclosed value", requestsMetric + `{method="GET} 1`, true, 0},
		{"no quotes", requestsMetric + `{method=GET} 1`, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := countSeries(strings.NewReader(tc.text))
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.requests, s.Requests)
		})
	}
}

// TestFlat: flat is no method value and no _OTHER series added; added names the new
// series; unbounded names the method values the SPEC does not allow.
func TestFlat(t *testing.T) {
	t.Parallel()
	parse := func(text string) series {
		s, err := countSeries(strings.NewReader(text))
		require.NoError(t, err)
		return s
	}
	a := parse(requestsMetric + `{code="201",method="POST",route="/v1/notes"} 1`)
	b := parse(requestsMetric + `{code="201",method="POST",route="/v1/notes"} 9`)
	c := parse(requestsMetric + `{code="201",method="POST",route="/v1/notes"} 9` + "\n" + requestsMetric + `{code="401",method="XYZZYXYZZY",route="/v1/notes"} 1`)
	require.True(t, flat(a, b))
	require.Empty(t, added(a, b))
	require.False(t, flat(b, c))
	require.Equal(t, []string{`quill_http_requests_total{code="401",method="XYZZYXYZZY",route="/v1/notes"}`}, added(b, c))
	require.Equal(t, []string{"XYZZYXYZZY"}, unbounded(c))
	require.Equal(t, []string{"XYZZYXYZZY"}, addedMethods(b, c))
	require.False(t, flat(a, series{Err: "refused"}), "a failed scrape is not flat")
	// A method value replaced by another at the same counts is not flat.
	d := parse(requestsMetric + `{code="201",method="PUT",route="/v1/notes"} 9`)
	require.False(t, flat(b, d))
	// A routed method's series new to the window (a legitimate 503) is
	// bounded: flat, though not unchanged. A series of _OTHER new to the
	// window is what an invented method mints: not flat.
	o := parse(requestsMetric + `{code="201",method="POST",route="/v1/notes"} 9` + "\n" + requestsMetric + `{code="401",method="_OTHER",route="/v1/notes"} 1`)
	o503 := parse(requestsMetric + `{code="201",method="POST",route="/v1/notes"} 9` + "\n" + requestsMetric + `{code="401",method="_OTHER",route="/v1/notes"} 1` + "\n" + requestsMetric + `{code="503",method="POST",route="/v1/notes"} 1`)
	require.True(t, flat(o, o503))
	require.False(t, unchanged(o, o503))
	require.True(t, unchanged(o, o))
	oNew := parse(requestsMetric + `{code="201",method="POST",route="/v1/notes"} 9` + "\n" + requestsMetric + `{code="401",method="_OTHER",route="/v1/notes"} 1` + "\n" + requestsMetric + `{code="404",method="_OTHER",route="unmatched"} 1`)
	require.False(t, flat(o, oNew))
	// Long values are kept by their hash and shown cut; two long methods
	// with the same start are two values.
	long := func(end string) string { return strings.Repeat("A", 1000) + end }
	e := parse(requestsMetric + `{method="` + long("M") + `"} 1` + "\n" + requestsMetric + `{method="` + long("N") + `"} 1`)
	require.Len(t, e.methods, 2)
	require.Equal(t, []string{"AAAAAAAAAAAAAAAA…(1001 bytes)", "AAAAAAAAAAAAAAAA…(1001 bytes)"}, unbounded(e))
	require.Equal(t, []string{`quill_http_requests_total{method="AAAAAAAAAAAAAAAA…(1001 bytes)"}`}, slices.Compact(added(a, e)))
}

// TestIdleOutcome: a 503 is a refusal whenever it came; a connection the
// phase's end closed was open; any other end was the server's.
func TestIdleOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code      string
		phaseOver bool
		want      string
	}{
		{"503", false, refused},
		{"503", true, refused},
		{"", true, openAtEnd},
		{"401", true, openAtEnd},
		{"", false, closed},
		{"401", false, closed},
	} {
		require.Equal(t, tc.want, idleOutcome(tc.code, tc.phaseOver), "%+v", tc)
	}
	require.Equal(t, "2xx", answerKind("204"))
	require.Equal(t, "http_401", answerKind("401"))
}

// TestIdleConns: against a server that answers each place's first
// connection (401, or 503 as past the share) and closes it, then holds
// the second open, the first round is counted as the server's doing and
// the second as open at the end; only the keep-alive half's answers count
// as answers, and a 503 never does.
func TestIdleConns(t *testing.T) {
	t.Parallel()
	const places = 4
	for _, tc := range []struct {
		first string
		want  idleStats
	}{
		{"401 Unauthorized", idleStats{Closed: places, Answers: counts{"http_401": places / 2}}},
		{"503 Service Unavailable", idleStats{Refused: places, Answers: counts{}}},
	} {
		t.Run(tc.first, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { ln.Close() })
			var accepted atomic.Int64
			var held sync.WaitGroup
			t.Cleanup(held.Wait)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					held.Go(func() {
						defer c.Close()
						if accepted.Add(1) <= places {
							// Answer, then read until the client closes, so
							// that no reset discards the answer.
							fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", tc.first)
							c.(*net.TCPConn).CloseWrite()
						}
						_, _ = io.Copy(io.Discard, c) // held until the client closes
					})
				}
			}()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan idleStats, 1)
			go func() {
				done <- idleConns(ctx, config{ownAddrs: true}.dialer(fromIdle), idleTarget{name: "api", addr: ln.Addr().String(), path: "/x"}, places)
			}()
			// A place dials again only once it has counted its first
			// connection: 2 × places accepted means every first one is
			// counted and every second one is open.
			deadline := time.Now().Add(10 * time.Second)
			for accepted.Load() < 2*places {
				require.True(t, time.Now().Before(deadline), "accepted %d", accepted.Load())
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			st := <-done
			want := tc.want
			want.Target, want.Places, want.Opened, want.OpenAtEnd = "api", places, 2*places, places
			st.MaxOpen = 0 // racy by design
			require.Equal(t, want, st)
		})
	}
}

// TestIssue24Report: the report's series, probe and new attackers' lines,
// each target judged.
func TestIssue24Report(t *testing.T) {
	t.Parallel()
	scr := func(text string, rss int64) series {
		s, err := countSeries(strings.NewReader(text))
		require.NoError(t, err)
		s.RSSKiB = rss
		return s
	}
	base := requestsMetric + `{code="201",method="POST",route="/v1/notes"} 1` + "\n" + durationMetric + `_count{method="POST",route="/v1/notes"} 1`
	other := base + "\n" + requestsMetric + `{code="401",method="_OTHER",route="/v1/notes"} 1`
	invented := other + "\n" + requestsMetric + `{code="401",method="` + strings.Repeat("A", 100) + `",route="/v1/notes"} 1`
	withAdmin := func(r *report) {
		r.cfg.adminURL, r.cfg.inventedRate, r.cfg.idleConns, r.cfg.ownAddrs = "http://127.0.0.1:9", 200, 1100, true
		r.quiet.start, r.quiet.end = scr(base, 50<<10), scr(base, 51<<10)
		r.hostile.start, r.hostile.end = scr(other, 60<<10), scr(other, 61<<10)
		ok := probeStats{Lat: ms(2, 3, 4), Answers: counts{"2xx": 3}}
		r.quiet.probe, r.hostile.probe = ok, ok
		r.attack.Invented = &rateStats{Sent: 4000, Answers: counts{"http_401": 2000, "http_404": 2000}}
		r.attack.Idle = []idleStats{{Target: "api", Places: 1100, Opened: 3000, Refused: 1800, Closed: 944, OpenAtEnd: 256, MaxOpen: 300, Answers: counts{"http_401": 600}},
			{Target: "admin", Places: 1100, Opened: 2900, Refused: 1700, Closed: 944, OpenAtEnd: 256, MaxOpen: 290, Answers: counts{"2xx": 600}}}
	}
	for _, tc := range []struct {
		name   string
		change func(*report)
		missed int
		want   []string
	}{
		{"no admin URL", func(*report) {}, 0, []string{"Series of the API's HTTP metrics: not measured (no --admin-url)", "targets missed: 0 of 9"}},
		{"all met", withAdmin, 0, []string{
			"Sources: each client from a loopback address of its own (legitimate clients 127.0.0.1, slowloris 127.0.0.2",
			"200 requests/s with a fresh invented method each (one in 4 60 KiB long)",
			"one host holding 1100 idle connections to the API and to its admin server each",
			"admin /healthz p99 / max ms        |                4 / 4 |                4 / 4 |         | hostile: each 2xx < 3s: met",
			"quiet end:     quill_http_requests_total 1, quill_http_request_duration_seconds 1, method values 1 (POST); API RSS 51.0 MiB",
			"hostile window while ~2000 invented methods were sent: unchanged (2, 1 series, 2 method values) — target flat (no method value and no _OTHER series added): met",
			"each a method the SPEC allows or _OTHER — target: met",
			"API RSS over the measured window (VmRSS at the scrapes): quiet 50.0 → 51.0 MiB (+1.0), hostile 60.0 → 61.0 MiB (+1.0)",
			`added by the attack's first seconds (quiet end → hostile start, 1): quill_http_requests_total{code="401",method="_OTHER",route="/v1/notes"}`,
			"invented methods: 4000 sent (200/s asked), 0 slots skipped (all 64 in flight); answers http_401=2000 http_404=2000",
			"idle host → admin: 1100 places, 2900 connections opened, at most 290 open at once as the host saw them (the server's accept queue included); 1700 refused with 503 (past its share), 944 closed by the server otherwise; 256 still open at the end; keep-alive requests answered 2xx=600",
			"targets missed: 0 of 12"}},
		{"an invented method minted a series", func(r *report) { withAdmin(r); r.hostile.end = scr(invented, 0) }, 2, []string{
			"quill_http_requests_total 2 → 3, quill_http_request_duration_seconds 1 → 1, method values 2 → 3 — target flat (no method value and no _OTHER series added): MISSED",
			`added in the hostile window: quill_http_requests_total{code="401",method="AAAAAAAAAAAAAAAA…(`,
			"method values at the hostile end: 1 a caller invented (AAAAAAAAAAAAAAAA…(100 bytes)) — target none: MISSED"}},
		{"a failed scrape", func(r *report) { withAdmin(r); r.hostile.end = series{Err: "connection refused"} }, 2, []string{
			"hostile end:   not read: connection refused", "not compared (a scrape failed)"}},
		{"a probe timed out", func(r *report) {
			withAdmin(r)
			r.hostile.probe = probeStats{Lat: ms(2, 3000), Answers: counts{"2xx": 1, "transport": 1}}
		}, 1, []string{"hostile: each 2xx < 3s: MISSED", "by answer: quiet 2xx=3; hostile 2xx=1 transport=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := goodReport()
			tc.change(r)
			var b strings.Builder
			require.Equal(t, tc.missed, r.write(&b), b.String())
			for _, s := range tc.want {
				require.Contains(t, b.String(), s)
			}
		})
	}
}

// TestValidateIssue24: the new flags' bounds.
func TestValidateIssue24(t *testing.T) {
	t.Parallel()
	args := func(extra ...string) []string {
		return append([]string{"--token", "a", "--flood-token", "b", "--bomb-token", "c"}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"admin URL", args("--admin-url", "http://127.0.0.1:9091"), ""},
		{"bad admin URL", args("--admin-url", "127.0.0.1:9091"), "--admin-url"},
		{"negative invented rate", args("--invented-method-rate", "-1"), "--invented-method-rate"},
		{"negative idle", args("--idle-conns", "-1"), "--idle-conns"},
		{"too many idle", args("--idle-conns", "20001"), "--idle-conns must be from 0 to 20000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseConfig(tc.args, func(string) string { return "" }, &strings.Builder{})
			if tc.want != "" {
				require.ErrorContains(t, err, tc.want)
				return
			}
			require.NoError(t, err)
			require.True(t, c.ownAddrs)
		})
	}
	c, err := parseConfig(args("--url", "http://10.1.2.3:8080"), func(string) string { return "" }, &strings.Builder{})
	require.NoError(t, err)
	require.False(t, c.ownAddrs)
	require.Equal(t, float64(defaultInventedRate), c.inventedRate)
	require.Equal(t, defaultIdleConns, c.idleConns)
	require.True(t, slices.Contains(boundedMethods, "_OTHER"))
}
