package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// rssSampleEvery is how often a phase's peak RSS is read: VmHWM is the
// kernel's own high-water mark, so sampling only keeps the last value seen
// should the process die (an OOM kill takes its /proc entry with it).
const rssSampleEvery = 200 * time.Millisecond

// peak is one process's peak resident set over a phase.
type peak struct {
	// KiB is the highest VmHWM read (0: never read).
	KiB int64
	// Reset says the kernel's mark was reset at the phase's start
	// (clear_refs); false means the peak is since the process started.
	Reset bool
	// Exited says the process was gone before the phase ended.
	Exited bool
	// Err is why nothing could be read, if so.
	Err string
}

// statusKiB reads a "Name:   123 kB" field of a /proc/<pid>/status text.
func statusKiB(status []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, rest, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok || string(name) != field {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("%s: unexpected value %q", field, rest)
		}
		v, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", field, err)
		}
		return v, nil
	}
	return 0, fmt.Errorf("no %s field", field)
}

// watchRSS resets pid's peak RSS mark (writing 5 to clear_refs) and samples
// VmHWM until ctx ends; wait returns the peak. pid 0 watches nothing.
func watchRSS(ctx context.Context, pid int) (wait func() peak) {
	var (
		p  peak
		wg sync.WaitGroup
	)
	if pid <= 0 {
		return func() peak { return peak{Err: "no pid given"} }
	}
	dir := "/proc/" + strconv.Itoa(pid)
	p.Reset = os.WriteFile(dir+"/clear_refs", []byte("5"), 0) == nil
	read := func() bool {
		b, err := os.ReadFile(dir + "/status")
		if err != nil {
			p.Exited = true
			if p.KiB == 0 {
				p.Err = err.Error()
			}
			return false
		}
		v, err := statusKiB(b, "VmHWM")
		if err != nil {
			p.Err = err.Error()
			return false
		}
		p.KiB = max(p.KiB, v)
		return true
	}
	wg.Go(func() {
		t := time.NewTicker(rssSampleEvery)
		defer t.Stop()
		for read() {
			select {
			case <-ctx.Done():
				read()
				return
			case <-t.C:
			}
		}
	})
	return func() peak {
		wg.Wait()
		return p
	}
}

// readKiB reads one "kB" field of pid's /proc status now, 0 when it cannot.
func readKiB(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	v, _ := statusKiB(b, field)
	return v
}
