package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dispatch"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	const base, maxDelay = 5 * time.Second, time.Hour
	for _, tc := range []struct {
		attempts int
		r        float64
		want     time.Duration
	}{
		{1, 0, base}, {1, 0.999, base}, // the first retry waits the minimum
		{2, 0, base}, {2, 0.5, base + base/2}, // ceiling 10s
		{3, 1, 20 * time.Second},              // ceiling 20s
		{10, 1, 2560 * time.Second},           // 5s·2^9
		{11, 1, maxDelay}, {100, 1, maxDelay}, // capped
		{100, 0, base},
		{0, 0.5, base}, // no attempt yet: the minimum
	} {
		got := dispatch.Backoff(tc.attempts, base, maxDelay, func() float64 { return tc.r })
		require.Equal(t, tc.want, got, "attempts %d, r %v", tc.attempts, tc.r)
	}
	// The bounds hold for any random draw.
	for n := 1; n < 40; n++ {
		got := dispatch.Backoff(n, base, maxDelay, func() float64 { return 0.999999 })
		require.GreaterOrEqual(t, got, base)
		require.LessOrEqual(t, got, maxDelay)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		err    error
		want   string
	}{
		{200, nil, "delivered"}, {204, nil, "delivered"}, {299, nil, "delivered"},
		{410, nil, "gone"},
		{301, nil, "retry"}, {302, nil, "retry"}, {400, nil, "retry"}, {404, nil, "retry"},
		{429, nil, "retry"}, {500, nil, "retry"}, {503, nil, "retry"}, {100, nil, "retry"},
		{0, context.DeadlineExceeded, "retry"},
		{0, &dispatch.RefusedError{Addr: "127.0.0.1:443", Reason: "loopback"}, "retry"},
		{0, errors.New("connection refused"), "retry"},
	} {
		require.Equal(t, tc.want, dispatch.Classify(tc.status, tc.err), "status %d err %v", tc.status, tc.err)
	}
	require.Equal(t, "HTTP 302: redirects are not followed", dispatch.Describe(302, nil))
	require.Equal(t, "HTTP 500", dispatch.Describe(500, nil))
	require.Contains(t, dispatch.Describe(0, fmt.Errorf("post: %w", context.DeadlineExceeded)), "timeout")
	require.Equal(t, "", dispatch.Describe(200, nil))
}

func TestBlocked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr    string
		blocked bool
	}{
		{"127.0.0.1", true}, {"127.255.0.1", true}, {"10.1.2.3", true}, {"172.16.0.1", true}, {"172.31.255.255", true},
		{"192.168.1.1", true}, {"169.254.169.254", true}, {"100.64.0.1", true}, {"0.0.0.0", true}, {"0.1.2.3", true},
		{"224.0.0.1", true}, {"255.255.255.255", true}, {"240.0.0.1", true}, {"192.0.2.1", true}, {"198.51.100.7", true},
		{"203.0.113.9", true}, {"198.18.0.1", true}, {"192.0.0.8", true},
		{"::1", true}, {"::", true}, {"fc00::1", true}, {"fd12:3456::1", true}, {"fe80::1", true}, {"fe80::1%eth0", true},
		{"ff02::1", true}, {"::ffff:127.0.0.1", true}, {"::ffff:10.0.0.1", true}, {"::ffff:169.254.169.254", true},
		{"::127.0.0.1", true}, {"64:ff9b::7f00:1", true}, {"64:ff9b::a9fe:a9fe", true}, {"64:ff9b:1::1", true},
		{"2002:7f00:1::1", true}, {"2002:c0a8:101::1", true}, {"2001:db8::1", true}, {"2001::1", true},
		{"3fff::1", true}, {"100::1", true}, {"fec0::1", true}, {"5f00::1", true},
		// Public.
		{"8.8.8.8", false}, {"1.1.1.1", false}, {"172.32.0.1", false}, {"100.128.0.1", false}, {"169.255.0.1", false},
		{"::ffff:8.8.8.8", false}, {"2606:4700:4700::1111", false}, {"2a00:1450:4001::1", false},
		{"64:ff9b::808:808", false}, {"2002:808:808::1", false},
	} {
		reason, blocked := dispatch.Blocked(netip.MustParseAddr(tc.addr))
		require.Equal(t, tc.blocked, blocked, "%s (%s)", tc.addr, reason)
		if blocked {
			require.NotEmpty(t, reason, tc.addr)
		}
	}
	_, blocked := dispatch.Blocked(netip.Addr{})
	require.True(t, blocked, "the zero address")
}

// FuzzBlocked checks the classifier against properties that must hold for
// every address: it never panics, blocks what the standard library calls
// non-public, gives a reason for each refusal, and classifies an
// IPv4-mapped address as its IPv4 address.
func FuzzBlocked(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::ffff:10.0.0.1", "8.8.8.8", "fe80::1%1", "64:ff9b::a00:1", "2002:a00:1::", "2606:4700::1"} {
		a := netip.MustParseAddr(s)
		b, _ := a.MarshalBinary()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var a netip.Addr
		if err := a.UnmarshalBinary(b); err != nil {
			return
		}
		reason, blocked := dispatch.Blocked(a)
		if blocked != (reason != "") {
			t.Fatalf("%s: blocked %v with reason %q", a, blocked, reason)
		}
		u := a.Unmap().WithZone("")
		if u.IsLoopback() || u.IsPrivate() || u.IsLinkLocalUnicast() || u.IsLinkLocalMulticast() || u.IsMulticast() ||
			u.IsUnspecified() || u.IsInterfaceLocalMulticast() {
			if !blocked {
				t.Fatalf("%s is not public but passes", a)
			}
		}
		if a.Is4In6() {
			_, b4 := dispatch.Blocked(a.Unmap())
			if b4 != blocked {
				t.Fatalf("%s and its IPv4 form differ", a)
			}
		}
	})
}

// listener is a TCP listener that counts what it accepted.
func listener(t *testing.T, network, addr string) (port string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	n := make(chan int, 1)
	n <- 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			n <- <-n + 1
		}
	}()
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, func() int { v := <-n; n <- v; return v }
}

func TestClientRefusesPrivateAddresses(t *testing.T) {
	t.Parallel()
	client, err := dispatch.NewClient(false, "", 2)
	require.NoError(t, err)
	port4, accepted4 := listener(t, "tcp4", "127.0.0.1:0")
	port6, accepted6 := listener(t, "tcp6", "[::1]:0")
	for _, target := range []string{
		"https://127.0.0.1:" + port4, "https://localhost:" + port4, "https://[::1]:" + port6,
		"https://[::ffff:127.0.0.1]:" + port4, "https://10.0.0.1:443", "https://172.16.0.1:443", "https://192.168.0.1:443",
		"https://169.254.169.254/latest/meta-data/", "https://[fc00::1]:443", "https://[fe80::1]:443", "https://100.64.0.1:443",
		"https://0.0.0.0:" + port4,
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		cancel()
		if resp != nil {
			resp.Body.Close()
		}
		var refused *dispatch.RefusedError
		require.ErrorAs(t, err, &refused, target)
		require.NotEmpty(t, refused.Reason, target)
	}
	require.Zero(t, accepted4(), "a refused address was connected to")
	require.Zero(t, accepted6(), "a refused address was connected to")
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url          string
		allowPrivate bool
		ok           bool
	}{
		{"https://example.com/hook", false, true},
		{"http://example.com/hook", false, false},
		{"http://example.com/hook", true, true},
		{"ftp://example.com/", true, false},
		{"https:///nohost", false, false},
		{"://bad", false, false},
		{"file:///etc/passwd", true, false},
	} {
		_, err := dispatch.CheckURL(tc.url, tc.allowPrivate)
		require.Equal(t, tc.ok, err == nil, "%s: %v", tc.url, err)
		if err != nil {
			var refused *dispatch.RefusedError
			require.ErrorAs(t, err, &refused)
		}
	}
}

// FuzzCheckURL: any string is refused or accepted without a panic, and an
// accepted one is https (without allowPrivate) with a host.
func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{"https://example.com/x", "http://x", "https://[::1]:80/", "https://%zz", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := dispatch.CheckURL(s, false)
		if err == nil && (u.Scheme != "https" || u.Hostname() == "") {
			t.Fatalf("%q accepted as %v", s, u)
		}
	})
}

func TestClientFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	target := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/elsewhere", func(http.ResponseWriter, *http.Request) { target <- struct{}{} })
	srv := newServer(t, mux)
	client, err := dispatch.NewClient(true, "", 2)
	require.NoError(t, err)
	resp, err := client.Post(srv.URL+"/hook", "application/json", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
	require.Len(t, target, 0, "the redirect was followed")
	require.Equal(t, "retry", dispatch.Classify(resp.StatusCode, nil))
}
