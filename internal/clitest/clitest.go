// Package clitest runs a Quill command's real program in-process for tests:
// its run(ctx, args, getenv, stdout, stderr) with a map for the environment,
// a free port, output captured safely while it runs, and a notification
// socket as systemd gives a daemon. Test-only.
package clitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
)

// stopTimeout bounds how long a stopped program may take to return.
const stopTimeout = 30 * time.Second

// SyncBuffer is a goroutine-safe buffer for a running program's output.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lines returns the JSON log lines written so far whose message is msg,
// each as an object; a line that is not JSON fails the test.
func (s *SyncBuffer) Lines(t testing.TB, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(s.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		if m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// Env returns a getenv over m.
func Env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// Process is a program running in-process.
type Process struct {
	// Stderr collects its logs.
	Stderr *SyncBuffer
	stop   func() error
}

// Stop cancels the program's context — what SIGTERM does through
// signal.NotifyContext — and returns what run returned; calling it again
// returns the same.
func (p *Process) Stop() error { return p.stop() }

// Start runs run with args until Stop or the end of the test.
func Start(t testing.TB, run cli.RunFunc, getenv func(string) string, args ...string) *Process {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &SyncBuffer{}
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, args, getenv, io.Discard, stderr) }()
	var once sync.Once
	var err error
	p := &Process{Stderr: stderr, stop: func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(stopTimeout):
				err = errors.New("the program did not stop after its context ended")
			}
		})
		return err
	}}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// RunOut runs run with args to completion and returns its stdout, its
// stderr and its error.
func RunOut(t testing.TB, run cli.RunFunc, getenv func(string) string, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), args, getenv, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}
