package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBusyTicks(t *testing.T) {
	t.Parallel()
	n, err := busyTicks([]byte("cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 1 2 3 4 5 6 7 8\n"))
	require.NoError(t, err)
	require.Equal(t, int64(100+5+50+3+2+1), n) // idle and iowait left out
	_, err = busyTicks([]byte("intr 1 2 3\n"))
	require.Error(t, err)
}

func TestCPUSince(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(100, 0)
	a := cpuTimes{at: t0, procs: map[string]int64{"api": 100, "gone": 5}, busy: 1000}
	b := cpuTimes{at: t0.Add(2 * time.Second), procs: map[string]int64{"api": 250, "new": 9}, busy: 1300}
	require.Equal(t, cpuUse{"api": 0.75, machineRow: 1.5}, b.since(a))
	require.Empty(t, a.since(a), "no time passed: no rates")
}

func TestSplitListAndPIDs(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"a", "b"}, splitList(" a, ,b,"))
	require.Nil(t, splitList(""))
	var m map[string]int
	v := pidValue{&m}
	require.NoError(t, v.Set("api=12"))
	require.Equal(t, map[string]int{"api": 12}, m)
	for _, bad := range []string{"api", "=3", "api=0", "api=x"} {
		require.Error(t, v.Set(bad), bad)
	}
}

func TestValidateLegitTenants(t *testing.T) {
	t.Parallel()
	base := []string{"--flood-token", "b", "--bomb-token", "c"}
	parse := func(extra ...string) error {
		_, err := parseConfig(append(base, extra...), func(string) string { return "" }, io.Discard)
		return err
	}
	require.NoError(t, parse("--token", "t1,t2", "--legit-tenant", "a,b"))
	require.ErrorContains(t, parse("--token", "t1,t2"), "--legit-tenant names 1 tenants for the 2 tokens")
	require.ErrorContains(t, parse("--token", "t1,t2,t3", "--legit-tenant", "a,b,c", "--legit-clients", "2"), "each legitimate tenant needs at least one client")
}

// TestAttackChildProtocol: the child says ready, attacks on start, and
// reports as one JSON line when its stdin closes (every attacker off here,
// so nothing is sent anywhere).
func TestAttackChildProtocol(t *testing.T) {
	t.Parallel()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runAttackChild(context.Background(), config{url: defaultURL}, inR, outW)
		outW.Close()
	}()
	out := bufio.NewReader(outR)
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, childReady+"\n", line)
	_, err = io.WriteString(inW, childStart+"\n")
	require.NoError(t, err)
	require.NoError(t, inW.Close())
	line, err = out.ReadString('\n')
	require.NoError(t, err)
	var r attackReport
	require.NoError(t, json.Unmarshal([]byte(line), &r))
	require.Equal(t, attackReport{}, r)
	require.NoError(t, <-done)
}
