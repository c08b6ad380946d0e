package mcpserver

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClientAddress(t *testing.T) {
	t.Parallel()
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name, remote, xff, want string
	}{
		{"an IPv4 peer", "192.0.2.7:5000", "", "192.0.2.7"},
		{"an IPv6 peer is its /64", "[2001:db8::1:2]:5000", "", "2001:db8::/64"},
		{"a mapped IPv4 peer", "[::ffff:192.0.2.7]:5000", "", "192.0.2.7"},
		{"an untrusted peer's X-Forwarded-For is ignored", "192.0.2.7:5000", "198.51.100.1", "192.0.2.7"},
		{"a trusted proxy names the client", "10.1.2.3:5000", "203.0.113.9, 198.51.100.1", "198.51.100.1"},
		{"proxies in a row are skipped", "10.1.2.3:5000", "198.51.100.1, 10.9.9.9", "198.51.100.1"},
		{"a hop with a port", "10.1.2.3:5000", "198.51.100.1:443", "198.51.100.1"},
		{"a malformed last hop leaves the proxy", "10.1.2.3:5000", "198.51.100.1, garbage", "10.1.2.3"},
		{"no hop leaves the proxy", "10.1.2.3:5000", "", "10.1.2.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
			if tc.xff != "" {
				r.Header.Set("X-Forwarded-For", tc.xff)
			}
			require.Equal(t, tc.want, clientAddress(r, proxies))
		})
	}
}

func TestParseAllowedOrigins(t *testing.T) {
	t.Parallel()
	got, err := ParseAllowedOrigins(" https://Agent.Example.com:443, http://localhost:3000 ,,http://[::1]:80")
	require.NoError(t, err)
	require.Equal(t, []string{"https://agent.example.com", "http://localhost:3000", "http://[::1]"}, got)
	for _, bad := range []string{"agent.example.com", "ftp://x", "https://x/path", "https://u@x", "https://x?q", "null"} {
		_, err := ParseAllowedOrigins(bad)
		require.Error(t, err, bad)
	}
}
