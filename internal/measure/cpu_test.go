package measure

import (
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, stat string
		parse      func([]byte) float64
		want       float64
	}{
		{"process: plain", "42 (api) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 100 0 0", parseProcessStat, 3.25},
		{"process: name with spaces and parens", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 1 0 0", parseProcessStat, 0.03},
		{"process: no parenthesis", "7 a R 1", parseProcessStat, -1},
		{"process: too short", "7 (a) R 1 2 3", parseProcessStat, -1},
		{"process: not a number", "7 (a) R 1 7 7 0 -1 0 0 0 0 0 x 2 0", parseProcessStat, -1},
		// busy = user + nice + system + irq + softirq (not steal).
		{"machine: full line", "cpu  100 20 30 9000 500 7 3 40 11 1\ncpu0 1 2 3 4\n", parseMachineStat, 1.6},
		{"machine: old kernel, four fields", "cpu 100 0 50 900\n", parseMachineStat, 1.5},
		{"machine: not the cpu line", "intr 1 2 3 4 5\n", parseMachineStat, -1},
		{"machine: not a number", "cpu 1 x 3 4 5\n", parseMachineStat, -1},
		{"machine: empty", "", parseMachineStat, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.parse([]byte(tc.stat)); got != tc.want {
				t.Errorf("parse(%q) = %v, want %v", tc.stat, got, tc.want)
			}
		})
	}
}

func TestProcessTicks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, stat, comm string
		ticks            int64
		err              bool
	}{
		{"plain", "42 (api) S 1 42 42 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 9 0 100 1000 10", "api", 175, false},
		{"name with spaces and parens", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1", "a (b) c", 7, false},
		{"postgres backend", "99 (postgres) S 1 99 99 0 -1 0 0 0 0 0 10 10 0 0 20 0 1 0 1 1 1", "postgres", 20, false},
		{"too short", "1 (x) S 1 2 3", "", 0, true},
		{"no name", "1 x S", "", 0, true},
		{"not numbers", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 u s 0 0 20 0 1 0 1 1 1", "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			comm, n, err := ProcessTicks([]byte(tc.stat))
			if tc.err {
				if err == nil {
					t.Fatalf("ProcessTicks(%q) = %q, %d; want an error", tc.stat, comm, n)
				}
				return
			}
			if err != nil {
				t.Fatalf("ProcessTicks(%q): %v", tc.stat, err)
			}
			if comm != tc.comm || n != tc.ticks {
				t.Errorf("ProcessTicks(%q) = %q, %d; want %q, %d", tc.stat, comm, n, tc.comm, tc.ticks)
			}
		})
	}
}

func TestReadsThisMachine(t *testing.T) {
	t.Parallel()
	if ProcessCPU() < 0 || MachineCPU() < 0 {
		t.Skip("no /proc here")
	}
	if MachineCPU() < ProcessCPU() {
		t.Errorf("machine busy %v s is less than this process's %v s", MachineCPU(), ProcessCPU())
	}
}

func TestCPUUse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		cpu0, cpu1     float64
		wall           time.Duration
		seconds, cores float64
	}{
		{"known", 1.5, 4.5, 2 * time.Second, 3, 1.5},
		{"first reading failed", -1, 4.5, 2 * time.Second, -1, -1},
		{"second reading failed", 1.5, -1, 2 * time.Second, -1, -1},
		{"no window", 1.5, 4.5, 0, -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if s, c := CPUUse(tc.cpu0, tc.cpu1, tc.wall); s != tc.seconds || c != tc.cores {
				t.Errorf("CPUUse(%v, %v, %v) = %v, %v; want %v, %v", tc.cpu0, tc.cpu1, tc.wall, s, c, tc.seconds, tc.cores)
			}
		})
	}
}
