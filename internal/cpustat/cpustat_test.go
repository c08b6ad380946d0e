package cpustat

import "testing"

func TestParseProcessStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       float64
	}{
		{"plain", "42 (api) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 100 0 0", 3.25},
		{"name with spaces and parens", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 1 0 0", 0.03},
		{"no parenthesis", "7 a R 1", -1},
		{"too short", "7 (a) R 1 2 3", -1},
		{"not a number", "7 (a) R 1 7 7 0 -1 0 0 0 0 0 x 2 0", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseProcessStat([]byte(tc.stat)); got != tc.want {
				t.Errorf("parseProcessStat(%q) = %v, want %v", tc.stat, got, tc.want)
			}
		})
	}
}

func TestParseMachineStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       float64
	}{
		// busy = user + nice + system + irq + softirq (not steal).
		{"full line", "cpu  100 20 30 9000 500 7 3 40 11 1\ncpu0 1 2 3 4\n", 1.6},
		{"old kernel, four fields", "cpu 100 0 50 900\n", 1.5},
		{"not the cpu line", "intr 1 2 3 4 5\n", -1},
		{"not a number", "cpu 1 x 3 4 5\n", -1},
		{"empty", "", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseMachineStat([]byte(tc.stat)); got != tc.want {
				t.Errorf("parseMachineStat(%q) = %v, want %v", tc.stat, got, tc.want)
			}
		})
	}
}

func TestReadsThisMachine(t *testing.T) {
	if Process() < 0 || Machine() < 0 {
		t.Skip("no /proc here")
	}
	if Machine() < Process() {
		t.Errorf("machine busy %v s is less than this process's %v s", Machine(), Process())
	}
}
