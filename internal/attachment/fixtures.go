package attachment

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"strings"
	"sync"
)

// BenchFixturePNG64K returns the PNG of the processing benchmark: a 392×294
// colour gradient with one bit of pseudo-random noise per pixel, which PNG
// compresses to about 64 KiB; its
// thumbnail is 256×192. The pixels are the same on every call and every
// platform (a fixed PCG seed), so benchmarks of the processing here and of
// the whole worker pipeline measure the same work. The caller owns the
// returned slice.
func BenchFixturePNG64K() []byte { return bytes.Clone(benchPNG()) }

// BenchFixtureText4K returns the text of the processing benchmark: exactly
// 4,096 bytes of UTF-8 in lines of pseudo-random words, some of them
// multi-byte, ending with a newline; the same on every call. The caller owns
// the returned slice.
func BenchFixtureText4K() []byte { return bytes.Clone(benchText()) }

var benchPNG = sync.OnceValue(func() []byte {
	const w, h = 392, 294
	r := rand.New(rand.NewPCG(1, 2))
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			n := uint8(r.IntN(2))
			img.SetNRGBA(x, y, color.NRGBA{
				R: uint8(x*255/w) + n,
				G: uint8(y*255/h) + n,
				B: uint8((x+y)*255/(w+h)) + n,
				A: 255,
			})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		panic("attachment: encode the benchmark fixture: " + err.Error())
	}
	return buf.Bytes()
})

var benchText = sync.OnceValue(func() []byte {
	const size = 4096
	vocabulary := []string{
		"the", "note", "agent", "retry", "operation", "key", "outbox", "inbox",
		"event", "stream", "commit", "once", "idempotent", "café", "naïve",
		"Grüße", "élan", "日本語", "테스트", "данные", "λόγος", "🙂",
	}
	r := rand.New(rand.NewPCG(3, 4))
	var b strings.Builder
	for b.Len() < size {
		n := 4 + r.IntN(9)
		for i := range n {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(vocabulary[r.IntN(len(vocabulary))])
		}
		b.WriteString(".\n")
	}
	// Cut to size-1 bytes at a line break, then pad the last line with
	// ASCII to exactly size bytes, newline included.
	text := b.String()
	cut := strings.LastIndexByte(text[:size-1], '\n') + 1
	text = text[:cut] + strings.Repeat("x", size-1-cut) + "\n"
	return []byte(text)
})
