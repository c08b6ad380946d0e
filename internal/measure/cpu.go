// Package measure holds what the benchmarks and load tools measure with:
// CPU time read from Linux's /proc — the CPU one process used, and the CPU
// the whole machine used (which, on a machine running nothing else, is the
// system under test, PostgreSQL and NATS included) — and exact latency
// distributions (nearest-rank percentiles over every sample).
package measure

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is Linux's USER_HZ, the unit of /proc's CPU times: 100 on
// every mainstream architecture (sysconf(_SC_CLK_TCK) reports it; Go has
// no portable call for it).
const ClockTicks = 100

// ProcessCPU returns this process's user+system CPU time in seconds, or -1
// where /proc/self/stat cannot be read.
func ProcessCPU() float64 { return readStat("/proc/self/stat", parseProcessStat) }

// MachineCPU returns the CPU time all CPUs spent busy since boot, in
// seconds (user, nice, system, irq and softirq of /proc/stat's "cpu" line:
// not idle or iowait, nor steal — time the hypervisor gave to other
// guests), or -1 where /proc/stat cannot be read.
func MachineCPU() float64 { return readStat("/proc/stat", parseMachineStat) }

// CPUUse turns two readings of ProcessCPU (or MachineCPU) taken wall apart
// into the CPU seconds used between them and the cores that is, both
// rounded to two places; -1, -1 when either reading failed or wall is not
// positive.
func CPUUse(cpu0, cpu1 float64, wall time.Duration) (seconds, cores float64) {
	if cpu0 < 0 || cpu1 < 0 || wall <= 0 {
		return -1, -1
	}
	return Round(cpu1-cpu0, 2), Round((cpu1-cpu0)/wall.Seconds(), 2)
}

func readStat(path string, parse func([]byte) float64) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	return parse(b)
}

func parseProcessStat(b []byte) float64 {
	_, ticks, err := ProcessTicks(b)
	if err != nil {
		return -1
	}
	return float64(ticks) / ClockTicks
}

// ProcessTicks parses a /proc/<pid>/stat text: the process's command name
// and its user+system CPU time (utime + stime) in ClockTicks. The name
// (field 2) may hold spaces and parentheses, so the fields are counted
// after its last ')'. It returns an error for a text that is not such a
// line.
func ProcessTicks(stat []byte) (comm string, ticks int64, err error) {
	open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("stat %q: no command name", stat)
	}
	f := strings.Fields(string(stat[end+1:]))
	// After the name: state(3) ... utime(14) stime(15), so f[11] and f[12].
	if len(f) < 13 {
		return "", 0, fmt.Errorf("stat: %d fields after the name, want at least 13", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return "", 0, fmt.Errorf("stat: utime %q stime %q", f[11], f[12])
	}
	return string(stat[open+1 : end]), u + s, nil
}

func parseMachineStat(b []byte) float64 {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return -1
	}
	var busy int64
	for i, s := range f[1:] {
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already counted in user (and guest_nice in nice).
		if i == 3 || i == 4 || i >= 7 {
			continue
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return -1
		}
		busy += v
	}
	return float64(busy) / ClockTicks
}
