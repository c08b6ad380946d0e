//go:build !race

// The race detector multiplies a process's memory (shadow memory) and
// slows decoding several times: this measurement runs without it
// (`go test ./cmd/attachment-worker/`).

package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/testkit"
)

// bombPNG is a 16-bit side×side PNG of one color but a few pixels: some
// tens of kilobytes that decode into 8 bytes a pixel.
func bombPNG(t *testing.T, side int) []byte {
	t.Helper()
	img := image.NewRGBA64(image.Rect(0, 0, side, side))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	for i := range 64 {
		img.SetRGBA64(i*side/64, i*side/64, color.RGBA64{R: 0x1234, A: 0xffff})
	}
	var buf bytes.Buffer
	require.NoError(t, (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, img))
	return buf.Bytes()
}

// peakRSS is a process's peak resident set size (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

// Eight image bombs at once against a worker that believes it has eight
// cores (GOMAXPROCS=8): under the decode budget its peak RSS stays below
// the budget + 128 MiB (the target), all eight processed in turn;
// with a budget that admits all eight the same run goes well above it. The
// measure is the real process's VmHWM — the kernel's high-water mark of
// resident memory, what an OOM killer and a cgroup limit see, heap and
// everything else. Scaled down from the 6320×6320 bomb (305 MiB)
// to 3072×3072 (72 MiB of pixels, ~97 MiB with the scaler's buffer) and a
// budget of two and a half bombs, with GOMEMLIMIT set as the container
// sets it (the budget + 64 MiB).
func TestImageBombsStayWithinTheDecodeBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes sixteen 3072×3072 16-bit images")
	}
	t.Parallel()
	bomb := bombPNG(t, 3072)
	weight := attachment.DecodeMemory(bomb)
	budget := weight * 5 / 2
	target := budget + 128<<20
	t.Logf("bomb: %d bytes, weight %d; budget %d; target peak RSS < %d", len(bomb), weight, budget, target)
	peak := func(decodeMemory int64) int64 {
		f := newFixture(t)
		var ids []uuid.UUID
		for range 8 {
			id, _ := f.publish(bomb)
			ids = append(ids, id)
		}
		vars := f.vars
		vars["GOMAXPROCS"], vars["GOMEMLIMIT"] = "8", strconv.FormatInt(budget+64<<20, 10)
		vars["QUILL_WORKER_DECODE_MEMORY"] = strconv.FormatInt(decodeMemory, 10)
		// The eight in one batch, processed at once as far as the budget
		// admits.
		vars[batchWaitEnv] = "500ms"
		p := startProcess(t, vars)
		waitReadyz(t, vars["QUILL_ADMIN_ADDR"], http.StatusOK)
		t.Logf("peak RSS once ready: %d MiB", peakRSS(t, p.cmd.Process.Pid)>>20)
		testkit.WaitFor(t, 120*time.Second, func() bool {
			for _, id := range ids {
				if f.status(id) != "processed" {
					return false
				}
			}
			return true
		}, "the eight bombs processed")
		rss := peakRSS(t, p.cmd.Process.Pid)
		p.stop(t)
		return rss
	}
	within := peak(budget)
	t.Logf("peak RSS under the budget: %d MiB", within>>20)
	require.Less(t, within, target, "peak RSS under the decode budget")
	without := peak(100 * weight)
	t.Logf("peak RSS with a budget admitting all eight: %d MiB", without>>20)
	require.Greater(t, without, target, "without the budget the same bombs exceed it")
}
