package httpserve_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/problem"
)

// waitLong bounds what a test waits for the server to do something it
// should do at once; far below the server's own timeouts (10s for
// headers, 120s idle), which are what a client without the limiter's
// room-making would wait for.
const waitLong = 3 * time.Second

// serve starts an http.Server on a listener of hs on 127.0.0.1 that
// answers "ok" (or holds a request until release is closed, for a path of
// /hold) and returns its address.
func serve(t *testing.T, hs httpserve.Settings, release <-chan struct{}) string {
	t.Helper()
	ln, err := hs.Listen("127.0.0.1:0")
	require.NoError(t, err)
	srv := ln.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
	})
	return ln.Addr().String()
}

// dialFrom connects to addr from the loopback address from (127.0.0.0/8
// is all loopback on Linux: each address stands for another host).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: waitLong}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// get sends one request on c and reads its answer within waitLong.
func get(c net.Conn, path string) (*http.Response, error) {
	_ = c.SetDeadline(time.Now().Add(waitLong))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp, resp.Body.Close()
}

// stillOpen counts the connections of cs the server has not closed: a
// read sees EOF or a reset on a closed one, and times out on an open one.
// The reads run at once (a read past its deadline reports the timeout
// before looking at the socket).
func stillOpen(cs []net.Conn) int {
	var open atomic.Int32
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				open.Add(1)
			}
		})
	}
	wg.Wait()
	return int(open.Load())
}

// One address's idle connections — keep-alives between requests and
// connections that sent nothing — fill the server's cap; another address
// is served at once, the longest-idle connections of the address holding
// the most making room. The idle host is a declared trusted proxy here, so
// that its share does not stop it first.
func TestIdleConnectionsMakeRoom(t *testing.T) {
	t.Parallel()
	hs := httpserve.Settings{MaxConnections: 40, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	addr := serve(t, hs, nil)
	var hog []net.Conn
	for i := range 60 {
		c := dialFrom(t, "127.0.0.1", addr)
		if i%2 == 0 { // a keep-alive that served one request
			resp, err := get(c, "/")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
		}
		hog = append(hog, c)
	}
	for range 5 {
		resp, err := get(dialFrom(t, "127.0.0.2", addr), "/")
		require.NoError(t, err, "another address is served while one holds the cap with idle connections")
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	open := stillOpen(hog)
	require.LessOrEqual(t, open, 40-5, "the idle host gave up connections for the others")
	require.Positive(t, open)
}

// An address other than a trusted proxy holds at most its share
// (MaxConnections / 4): a new connection past it takes the place of the
// address's own longest-idle one, or, with all of them busy, is answered
// 503 at once — while another address is still served.
func TestEachAddressHasItsShare(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	hs := httpserve.Settings{MaxConnections: 40}
	require.Equal(t, 10, hs.AddressShare())
	addr := serve(t, hs, release)
	defer close(release)

	// Each connection serves a request and stays open, idle: past ten,
	// each new one takes the place of the address's oldest.
	var idle []net.Conn
	for range 25 {
		c := dialFrom(t, "127.0.0.3", addr)
		resp, err := get(c, "/")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		idle = append(idle, c)
	}
	// (Which ten is the server's view of idleness: a connection whose
	// return to idle the server noted late may outlive the next one.)
	require.Equal(t, 10, stillOpen(idle), "the address kept its share, its longest-idle connections closed for its new ones")
	require.Equal(t, 1, stillOpen(idle[24:]), "the newest is kept")
	require.LessOrEqual(t, stillOpen(idle[:10]), 1, "the oldest are closed")
	for _, c := range idle {
		_ = c.Close()
	}

	// Ten busy requests hold the share; the eleventh connection is refused
	// with a problem, not left waiting.
	for range 10 {
		c := dialFrom(t, "127.0.0.4", addr)
		_, err := io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		c := dialFrom(t, "127.0.0.4", addr)
		resp, err := get(c, "/")
		if err != nil {
			return false // the listener may not have seen every held request yet
		}
		if resp.StatusCode == http.StatusOK {
			return false
		}
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		return true
	}, waitLong, 50*time.Millisecond)

	resp, err := get(dialFrom(t, "127.0.0.5", addr), "/")
	require.NoError(t, err, "another address is served beside a full share")
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// Busy connections are never closed to make room: at the cap with every
// connection working on a request, the next one waits to be accepted
// until one finishes.
func TestBusyConnectionsAreKept(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	hs := httpserve.Settings{MaxConnections: 4, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	addr := serve(t, hs, release)
	var busy []net.Conn
	for range 4 {
		c := dialFrom(t, "127.0.0.6", addr)
		_, err := io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		busy = append(busy, c)
	}
	waiting := dialFrom(t, "127.0.0.7", addr)
	got := make(chan error, 1)
	go func() {
		resp, err := get(waiting, "/")
		if err == nil && resp.StatusCode != http.StatusOK {
			err = errors.New(resp.Status)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a fifth connection was served while four requests held the cap: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-got)
	for _, c := range busy {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err, "a busy request was not cut to make room")
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
}

func TestParsePrefixes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{"", nil, ""},
		{" , ", nil, ""},
		{"10.0.0.0/8", []string{"10.0.0.0/8"}, ""},
		{"10.1.2.3/8, 192.0.2.7", []string{"10.0.0.0/8", "192.0.2.7/32"}, ""},
		{"::ffff:192.0.2.7", []string{"192.0.2.7/32"}, ""},
		{"fd00::/8,2001:db8::1", []string{"fd00::/8", "2001:db8::1/128"}, ""},
		{"10.0.0.0/33", nil, `"10.0.0.0/33"`},
		{"lb.internal", nil, `"lb.internal" is neither an IP address nor a CIDR prefix`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := httpserve.ParsePrefixes(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			var s []string
			for _, p := range got {
				s = append(s, p.String())
			}
			require.Equal(t, tc.want, s)
		})
	}
}

// QUILL_TRUSTED_PROXIES is read with the other settings, and a bad item
// is an error naming the variable and the item.
func TestDefineReadsTrustedProxies(t *testing.T) {
	t.Parallel()
	parse := func(v string) (httpserve.Settings, error) {
		var hs httpserve.Settings
		s := config.New("x", "", func(k string) string {
			if k == "QUILL_TRUSTED_PROXIES" {
				return v
			}
			return ""
		}, io.Discard)
		hs.Define(s)
		return hs, s.Parse(nil)
	}
	hs, err := parse("10.0.0.0/8, 192.0.2.1")
	require.NoError(t, err)
	require.Equal(t, httpserve.TrustedProxies{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32")}, hs.TrustedProxies)
	require.Equal(t, httpserve.DefaultMaxConnections, hs.MaxConnections)
	_, err = parse("10.0.0.0/8,bad")
	require.ErrorContains(t, err, "QUILL_TRUSTED_PROXIES")
	require.ErrorContains(t, err, `"bad"`)
}
