package dbtest

import (
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// State is what a Switch does to its clients' PostgreSQL traffic.
type State int

const (
	// Up lets everything through.
	Up State = iota
	// Refused cuts the open connections and closes new ones at once, as
	// when the server is down.
	Refused
	// Silent lets nothing through either way and closes nothing, as when
	// the network drops the server's packets; what was sent meanwhile goes
	// through once the switch is Up again.
	Silent
)

// Switch is a TCP proxy in front of PostgreSQL that makes it unreachable on
// demand: the database outages of the tests.
type Switch struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	change *sync.Cond // signalled when state or closed changes
	state  State
	closed bool
	conns  map[net.Conn]struct{}
}

// NewSwitch starts a switch, Up, in front of the server of dbURL and
// returns it with dbURL rewritten to go through it. It stops, cutting every
// connection, when t ends.
func NewSwitch(t testing.TB, dbURL string) (*Switch, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Switch{target: u.Host, ln: ln, conns: map[net.Conn]struct{}{}}
	p.change = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		p.closed = true
		p.cutLocked()
		p.change.Broadcast()
		p.mu.Unlock()
		p.wg.Wait()
	})
	u.Host = ln.Addr().String()
	return p, u.String()
}

// Set switches the traffic to s.
func (p *Switch) Set(s State) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = s
	if s == Refused {
		p.cutLocked()
	}
	p.change.Broadcast()
}

func (p *Switch) cutLocked() {
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *Switch) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.closed || p.state == Refused
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed || p.state == Refused {
			client.Close()
			server.Close()
		} else {
			p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		}
		p.mu.Unlock()
		p.wg.Go(func() { p.pump(server, client) })
		p.wg.Go(func() { p.pump(client, server) })
	}
}

// pump copies src to dst, holding each chunk while the switch is Silent.
func (p *Switch) pump(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.state == Silent && !p.closed {
				p.change.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
