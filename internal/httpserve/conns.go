package httpserve

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/problem"
)

// Listener is a TCP listener that holds at most Settings.MaxConnections
// connections open, of which one source address holds at most
// Settings.AddressShare (trusted proxies excepted). An idle connection —
// a keep-alive between requests, or one that has sent no request for
// newConnGrace since it was accepted — is what makes room: at the cap the longest-idle connection of the
// address holding the most is closed for the new one; an address at its
// share first gives up its own longest-idle one, and with none idle its
// new connection is answered 503 and closed. Only when every connection is
// busy with a request does a new one wait in the kernel's accept queue.
// Which connections are idle comes from the http.Server that
// Listener.Server returns.
type Listener struct {
	net.Listener
	settings Settings
	share    int

	mu      sync.Mutex
	changed *sync.Cond // a connection closed or became idle
	open    int
	peers   map[netip.Addr]*peer
	closed  bool
}

// peer is one source address's open connections.
type peer struct {
	conns map[*conn]struct{}
}

func newListener(ln net.Listener, h Settings) *Listener {
	l := &Listener{Listener: ln, settings: h, share: h.AddressShare(), peers: map[netip.Addr]*peer{}}
	l.changed = sync.NewCond(&l.mu)
	return l
}

// newConnGrace is how long a connection that has sent no request yet is
// not taken for idle: its request may be in the socket, unread, and
// closing it would lose it; a connection silent for this long is as idle
// as a keep-alive.
const newConnGrace = time.Second

// conn is an accepted connection the listener counts until it is closed.
type conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr
	// Guarded by l.mu: whether the connection counts (false once closed
	// or taken to make room), whether it is between requests (idle) or
	// still waits for its first (fresh), and since when.
	counted   bool
	idle      bool
	fresh     bool
	since     time.Time
	closeOnce sync.Once
	closeErr  error
}

// Close closes the connection and gives its place back.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.l.release(c)
		c.closeErr = c.Conn.Close()
	})
	return c.closeErr
}

// overShare is the answer to a connection past its address's share: a 503
// problem, written at once into the new connection's empty send buffer, and
// Connection: close.
var overShare = func() []byte {
	doc := problem.New(http.StatusServiceUnavailable, contract.CodeUnavailable,
		"This address holds its whole share of the server's connections and none of them is idle; reuse an open connection, or close one, and send the request again.").JSON()
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: %s\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s",
		problem.ContentType, len(doc), doc)
}()

// Accept returns the next connection that has room, closing idle ones to
// make it (see Listener). It returns the underlying listener's error, or
// net.ErrClosed once Close was called.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c, victims, err := l.admit(raw)
		for _, v := range victims {
			_ = v.Conn.Close()
		}
		if err != nil {
			_ = raw.Close()
			return nil, err
		}
		if c == nil { // past its address's share
			_ = raw.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = raw.Write(overShare)
			_ = raw.Close()
			continue
		}
		return c, nil
	}
}

// admit counts raw in, choosing the idle connections that make room for it
// (closed by the caller, outside the lock). It returns a nil conn when raw
// is past its address's share with nothing of its own to give up, and
// net.ErrClosed when the listener closed while raw waited for room.
func (l *Listener) admit(raw net.Conn) (*conn, []*conn, error) {
	addr := remoteAddr(raw)
	l.mu.Lock()
	defer l.mu.Unlock()
	var victims []*conn
	p := l.peers[addr]
	if p != nil && len(p.conns) >= l.share && !l.settings.TrustedProxies.Contains(addr) {
		v, _ := p.longestIdle(time.Now())
		if v == nil {
			return nil, nil, nil
		}
		l.drop(v)
		victims = append(victims, v)
	}
	for l.open >= l.settings.MaxConnections {
		if l.closed {
			return nil, victims, net.ErrClosed
		}
		v, ripe := l.idleOfFullest(time.Now())
		if v != nil {
			l.drop(v)
			victims = append(victims, v)
			continue
		}
		if !ripe.IsZero() { // a fresh connection turns idle then
			t := time.AfterFunc(time.Until(ripe), func() {
				l.mu.Lock()
				l.changed.Broadcast()
				l.mu.Unlock()
			})
			l.changed.Wait()
			t.Stop()
			continue
		}
		l.changed.Wait()
	}
	if l.closed {
		return nil, victims, net.ErrClosed
	}
	if p = l.peers[addr]; p == nil {
		p = &peer{conns: map[*conn]struct{}{}}
		l.peers[addr] = p
	}
	c := &conn{Conn: problemConn{raw}, l: l, addr: addr, counted: true, fresh: true, since: time.Now()}
	p.conns[c] = struct{}{}
	l.open++
	return c, victims, nil
}

// Close closes the listener; an Accept waiting for room returns
// net.ErrClosed. Open connections stay: the server's Shutdown ends them.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.changed.Broadcast()
	l.mu.Unlock()
	err := l.Listener.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// connState follows net/http's view of each connection: idle when it
// waits for its next request (StateIdle), busy while a request is read or
// answered, fresh until its first.
func (l *Listener) connState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.counted {
		return
	}
	switch state {
	case http.StateIdle:
		c.idle, c.fresh, c.since = true, false, time.Now()
		l.changed.Broadcast()
	case http.StateActive, http.StateHijacked:
		c.idle, c.fresh = false, false
	}
}

func (l *Listener) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.counted {
		l.drop(c)
		l.changed.Broadcast()
	}
}

// drop stops counting c; l.mu is held.
func (l *Listener) drop(c *conn) {
	c.counted = false
	l.open--
	p := l.peers[c.addr]
	delete(p.conns, c)
	if len(p.conns) == 0 {
		delete(l.peers, c.addr)
	}
}

// idleOfFullest returns the longest-idle connection of the address that
// holds the most connections and has an idle one, or nil and the earliest
// time a fresh connection turns idle (zero if none will); l.mu is held.
// Runs only at the cap.
func (l *Listener) idleOfFullest(now time.Time) (*conn, time.Time) {
	var best *conn
	var ripe time.Time
	most := 0
	for _, p := range l.peers {
		v, r := p.longestIdle(now)
		if !r.IsZero() && (ripe.IsZero() || r.Before(ripe)) {
			ripe = r
		}
		if v != nil && len(p.conns) > most {
			best, most = v, len(p.conns)
		}
	}
	return best, ripe
}

// longestIdle returns p's connection idle the longest at now, or nil and
// the earliest time one of its fresh connections turns idle.
func (p *peer) longestIdle(now time.Time) (*conn, time.Time) {
	var best *conn
	var ripe time.Time
	for c := range p.conns {
		idle := c.idle
		if c.fresh {
			if r := c.since.Add(newConnGrace); r.After(now) {
				if ripe.IsZero() || r.Before(ripe) {
					ripe = r
				}
			} else {
				idle = true
			}
		}
		if idle && (best == nil || c.since.Before(best.since)) {
			best = c
		}
	}
	return best, ripe
}

// remoteAddr is c's peer address, IPv4-mapped addresses unmapped; the zero
// Addr for a connection that is not TCP (all of which then share one
// address).
func remoteAddr(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
