package clitest

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// NotifySocket listens on the unix datagram socket name ("@…" for the
// abstract namespace) as systemd's notification socket does, until the test
// ends, and returns the datagrams it receives: a daemon's NOTIFY_SOCKET.
func NotifySocket(t testing.TB, name string) <-chan string {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	require.NoError(t, err)
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return got
}
