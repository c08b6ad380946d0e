package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/quillhq/quill/internal/measure"
)

// postgresComm is the command name of every PostgreSQL process (postmaster
// and backends), summed as one row: the benchmark's database is the only
// busy one on the server it creates.
const postgresComm = "postgres"

// cpuTimes is a snapshot of CPU time used so far, in clock ticks, per named
// process (and "postgres" for every PostgreSQL process), with the machine's
// busy total and when it was read.
type cpuTimes struct {
	at    time.Time
	procs map[string]int64
	busy  int64 // the machine's non-idle ticks (all CPUs) from /proc/stat
}

// busyTicks reads the machine's non-idle ticks from a /proc/stat text: the
// first ("cpu") line's fields, less idle and iowait; guest time is already
// in user and nice. Unlike measure.MachineCPU it counts steal as busy.
func busyTicks(stat []byte) (int64, error) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q", line)
	}
	var busy int64
	for i, v := range f[1:min(len(f), 9)] { // user nice system idle iowait irq softirq steal
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, nil
}

// readCPU snapshots the processes of pids (name → pid; a pid that is gone
// is left out) and every PostgreSQL process. Errors reading one process are
// not fatal: it is missing from the snapshot, and the report shows "-".
func readCPU(pids map[string]int) cpuTimes {
	t := cpuTimes{at: time.Now(), procs: map[string]int64{}}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		t.busy, _ = busyTicks(b)
	}
	for name, pid := range pids {
		if pid <= 0 {
			continue
		}
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if _, n, err := measure.ProcessTicks(b); err == nil {
				t.procs[name] = n
			}
		}
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if comm, n, err := measure.ProcessTicks(b); err == nil && comm == postgresComm {
			t.procs[postgresComm] += n
		}
	}
	return t
}

// cpuUse is the cores each process used on average between two snapshots,
// and the machine's busy cores ("machine").
type cpuUse map[string]float64

// machineRow names the machine's total in a cpuUse.
const machineRow = "machine"

// since is the cores used from a to b, per process present in both.
func (b cpuTimes) since(a cpuTimes) cpuUse {
	secs := b.at.Sub(a.at).Seconds()
	u := cpuUse{}
	if secs <= 0 {
		return u
	}
	for name, nb := range b.procs {
		if na, ok := a.procs[name]; ok {
			u[name] = float64(nb-na) / measure.ClockTicks / secs
		}
	}
	if a.busy > 0 && b.busy >= a.busy {
		u[machineRow] = float64(b.busy-a.busy) / measure.ClockTicks / secs
	}
	return u
}
