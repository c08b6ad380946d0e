package dbtest

import (
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Proxy is a TCP proxy in front of PostgreSQL that can lose a COMMIT's
// reply: once armed, the next reply that completes a COMMIT — or an
// implicit transaction of several statements committed at their Sync — is
// read to its end (ReadyForQuery) and discarded, and the connection is cut. The server
// has committed; the client cannot know.
type Proxy struct {
	target string
	ln     net.Listener
	mu     sync.Mutex
	armed  bool
	cuts   int
}

// NewProxy starts a proxy to the server of dbURL and returns it with dbURL
// rewritten to go through it. It stops when t ends.
func NewProxy(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{target: u.Host, ln: ln}
	Forward(t, ln, p.target, func(client, server net.Conn) { _, _ = io.Copy(server, client) }, p.serverToClient)
	u.Host = ln.Addr().String()
	return p, u.String()
}

// LoseNextReply arms the proxy: the next reply that completes a COMMIT is
// swallowed and its connection cut.
func (p *Proxy) LoseNextReply() {
	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
}

// Cuts returns how many replies the proxy has swallowed.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// serverToClient copies server messages to the client message by message.
// While armed it holds back each reply up to its ReadyForQuery: a reply that
// completed a COMMIT is swallowed and the connection cut (both sides, after
// the server has committed); any other reply is passed on.
func (p *Proxy) serverToClient(server, client net.Conn) {
	defer client.Close()
	defer server.Close()
	header := make([]byte, 5)
	first := true
	var held []byte
	committed, completed, failed := false, 0, false
	for {
		if first {
			// The answer to an SSLRequest is one byte, not a message.
			if _, err := io.ReadFull(server, header[:1]); err != nil {
				return
			}
			first = false
			if header[0] == 'N' || header[0] == 'S' {
				if _, err := client.Write(header[:1]); err != nil {
					return
				}
				continue
			}
			if _, err := io.ReadFull(server, header[1:]); err != nil {
				return
			}
		} else if _, err := io.ReadFull(server, header); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(header[1:])) - 4
		msg := make([]byte, 5+max(n, 0))
		copy(msg, header)
		if _, err := io.ReadFull(server, msg[5:]); err != nil {
			return
		}
		p.mu.Lock()
		armed := p.armed
		p.mu.Unlock()
		if !armed {
			if _, err := client.Write(msg); err != nil {
				return
			}
			continue
		}
		held = append(held, msg...)
		switch msg[0] {
		case 'C':
			completed++
			if strings.HasPrefix(string(msg[5:]), "COMMIT") {
				committed = true
			}
		case 'E':
			failed = true
		}
		if msg[0] != 'Z' {
			continue
		}
		// An implicit transaction (statements without BEGIN, one Sync:
		// db.Pipeline's one-trip transaction) commits at the Sync: its
		// reply completed more than one statement (a lone statement is a
		// read, such as a token's lookup, as often as a write), reported
		// no error, and ends idle.
		if !committed && completed > 1 && !failed && len(msg) == 6 && msg[5] == 'I' {
			committed = true
		}
		completed, failed = 0, false
		if !committed {
			if _, err := client.Write(held); err != nil {
				return
			}
			held = held[:0]
			continue
		}
		p.mu.Lock()
		p.armed = false
		p.cuts++
		p.mu.Unlock()
		return // the server committed; its reply is lost
	}
}
