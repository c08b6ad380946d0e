package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/dbtest"
)

// pgGate is a TCP proxy in front of PostgreSQL for one program, which can
// stop that program at a precise point of the protocol, so that the suite's
// SIGKILL lands exactly where a crash is most harmful:
//
//   - HoldStatement(marker): the next execution of a statement whose SQL
//     contains marker is never delivered to the server (the relay has
//     published a batch and its acknowledgements are in; the UPDATE that
//     marks them published is held) — a kill then leaves events published
//     but not marked, and their republish must be a duplicate JetStream
//     drops;
//   - HoldCommitReply(): the next reply that completes a COMMIT is withheld
//     (the server committed the worker's inbox row and effect; the worker
//     never learns it, so never acknowledges) — a kill then forces a
//     redelivery the inbox must recognise.
//
// Each hold fires once; the held connection is cut when its client dies.
// Unarmed, the gate forwards bytes unchanged.
type pgGate struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	marker string // statement mode: non-empty when armed
	commit bool   // commit-reply mode armed
	held   chan struct{}
	fired  int
}

func newPGGate(t *testing.T, target string) *pgGate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := &pgGate{target: target, ln: ln}
	dbtest.Forward(t, ln, target, g.clientToServer, g.serverToClient)
	return g
}

// Addr is the gate's host:port.
func (g *pgGate) Addr() string { return g.ln.Addr().String() }

// HoldStatement arms the statement hold; the channel is closed when a
// statement was held.
func (g *pgGate) HoldStatement(marker string) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.marker, g.commit, g.held = marker, false, make(chan struct{})
	return g.held
}

// HoldCommitReply arms the commit-reply hold; the channel is closed when a
// reply was held.
func (g *pgGate) HoldCommitReply() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.marker, g.commit, g.held = "", true, make(chan struct{})
	return g.held
}

// Disarm cancels a hold that has not fired.
func (g *pgGate) Disarm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.marker, g.commit = "", false
}

// Fired returns how many holds fired.
func (g *pgGate) Fired() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fired
}

// fire claims the armed hold of the given kind; only one connection wins.
func (g *pgGate) fire(statement bool, sql string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case statement && g.marker != "" && bytes.Contains([]byte(sql), []byte(g.marker)):
		g.marker = ""
	case !statement && g.commit:
		g.commit = false
	default:
		return false
	}
	g.fired++
	close(g.held)
	return true
}

func (g *pgGate) armedStatement() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.marker != ""
}

func (g *pgGate) armedCommit() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.commit
}

// readMsg reads one typed protocol message (type byte, int32 length,
// payload).
func readMsg(r io.Reader) ([]byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
	if n < 0 || n > 1<<30 {
		return nil, errors.New("pggate: bad message length")
	}
	msg := make([]byte, 5+n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[5:])
	return msg, err
}

// cstring splits a NUL-terminated string off b.
func cstring(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

// clientToServer forwards the client's messages, remembering prepared
// statements' SQL by name, and holds the first execution (Bind of such a
// statement, or a simple Query) that the armed marker matches.
func (g *pgGate) clientToServer(client, server net.Conn) {
	defer server.Close()
	defer client.Close()
	// Untyped start-up packets: SSLRequest/GSSENCRequest (answered by one
	// byte, then another start-up packet follows), the StartupMessage, or
	// a CancelRequest.
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(client, hdr[:4]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:4]))
		if n < 8 || n > 1<<16 {
			return
		}
		pkt := make([]byte, n)
		copy(pkt, hdr[:4])
		if _, err := io.ReadFull(client, pkt[4:]); err != nil {
			return
		}
		if _, err := server.Write(pkt); err != nil {
			return
		}
		code := binary.BigEndian.Uint32(pkt[4:8])
		if code != 80877103 && code != 80877104 { // not SSLRequest / GSSENCRequest
			break
		}
	}
	stmts := map[string]string{}
	for {
		msg, err := readMsg(client)
		if err != nil {
			return
		}
		body := msg[5:]
		var exec string // SQL this message executes, if any
		switch msg[0] {
		case 'P': // Parse: statement name, query
			name, rest := cstring(body)
			query, _ := cstring(rest)
			stmts[name] = query
		case 'B': // Bind: portal name, statement name
			_, rest := cstring(body)
			stmt, _ := cstring(rest)
			exec = stmts[stmt]
		case 'Q': // simple Query
			exec, _ = cstring(body)
		case 'C': // Close statement: forget it
			if len(body) > 0 && body[0] == 'S' {
				name, _ := cstring(body[1:])
				delete(stmts, name)
			}
		}
		if exec != "" && g.armedStatement() && g.fire(true, exec) {
			// Held: nothing more of this session reaches the server.
			_, _ = io.Copy(io.Discard, client)
			return
		}
		if _, err := server.Write(msg); err != nil {
			return
		}
	}
}

// serverToClient forwards the server's messages; when the commit-reply
// hold is armed, a CommandComplete "COMMIT" and everything after it are
// withheld from the client.
func (g *pgGate) serverToClient(server, client net.Conn) {
	defer client.Close()
	defer server.Close()
	started := false
	for {
		if !started {
			// Answers to SSLRequest/GSSENCRequest are a single byte.
			var b [1]byte
			if _, err := io.ReadFull(server, b[:]); err != nil {
				return
			}
			if b[0] == 'N' || b[0] == 'S' || b[0] == 'G' {
				if _, err := client.Write(b[:]); err != nil {
					return
				}
				continue
			}
			started = true
			rest, err := readMsgAfterType(server, b[0])
			if err != nil {
				return
			}
			if _, err := client.Write(rest); err != nil {
				return
			}
			continue
		}
		msg, err := readMsg(server)
		if err != nil {
			return
		}
		if msg[0] == 'C' && bytes.HasPrefix(msg[5:], []byte("COMMIT")) && g.armedCommit() && g.fire(false, "") {
			// The server committed; the client never hears of it.
			_, _ = io.Copy(io.Discard, server)
			return
		}
		if _, err := client.Write(msg); err != nil {
			return
		}
	}
}

// readMsgAfterType reads the rest of a message whose type byte was read.
func readMsgAfterType(r io.Reader, typ byte) ([]byte, error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(l[:])) - 4
	if n < 0 || n > 1<<30 {
		return nil, errors.New("pggate: bad message length")
	}
	msg := make([]byte, 5+n)
	msg[0] = typ
	copy(msg[1:5], l[:])
	_, err := io.ReadFull(r, msg[5:])
	return msg, err
}
