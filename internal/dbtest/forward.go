package dbtest

import (
	"net"
	"sync"
	"testing"
)

// Forward serves ln until t ends: each accepted client gets a connection to
// target, and up(client, server) and down(server, client) pump the two
// directions, each in its own goroutine. At the end of t the listener and
// every connection are closed and the pumps waited for. The fault-injecting
// PostgreSQL proxies of the tests (NewProxy here, e2e's gate) differ only in
// their pumps.
func Forward(t testing.TB, ln net.Listener, target string, up, down func(from, to net.Conn)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Go(func() { up(client, server) })
			wg.Go(func() { down(server, client) })
		}
	})
}
