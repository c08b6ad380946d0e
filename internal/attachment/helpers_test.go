package attachment_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/testkit"
)

// inputOf is data declared correctly: its own size and SHA-256.
func inputOf(data []byte, declaredType string) attachment.Input {
	sum := sha256.Sum256(data)
	return attachment.Input{
		ContentType: declaredType,
		Filename:    "file",
		Size:        len(data),
		SHA256:      hex.EncodeToString(sum[:]),
		Data:        data,
	}
}

// gradient is a w×h test picture whose every pixel is different enough that
// a mistaken scale or crop would show.
func gradient(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, color.NRGBA{R: uint8(x * 255 / w), G: uint8(y * 255 / h), B: uint8((x ^ y) & 0xff), A: 255})
		}
	}
	return img
}

func encodePNG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, img))
	return b.Bytes()
}

func encodeJPEG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, jpeg.Encode(&b, img, &jpeg.Options{Quality: 80}))
	return b.Bytes()
}

func encodeGIF(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, gif.Encode(&b, img, nil))
	return b.Bytes()
}

// pngChunk is one PNG chunk with its CRC.
func pngChunk(typ string, data []byte) []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.BigEndian, uint32(len(data)))
	b.WriteString(typ)
	b.Write(data)
	_ = binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte(typ), data...)))
	return b.Bytes()
}

// bombPNG is a well-formed PNG header claiming a w×h RGBA image, followed by
// a few bytes of image data and the end chunk: decoding it would allocate
// w×h×4 bytes before noticing the data is short.
func bombPNG(w, h uint32) []byte {
	ihdr := binary.BigEndian.AppendUint32(nil, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 6, 0, 0, 0) // 8-bit RGBA, deflate, no filter, no interlace
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	b.Write(pngChunk("IHDR", ihdr))
	// A zlib stream of 64 zero bytes (stored block).
	idat := []byte{0x78, 0x01, 0x01, 64, 0, 0xBF, 0xFF}
	idat = append(idat, make([]byte, 64)...)
	idat = append(idat, 0, 0x40, 0, 0x01) // Adler-32 of 64 zeros
	b.Write(pngChunk("IDAT", idat))
	b.Write(pngChunk("IEND", nil))
	return b.Bytes()
}

// bombGIF is a GIF header whose logical screen is w×h, with nothing after.
func bombGIF(w, h uint16) []byte {
	b := []byte("GIF89a")
	b = binary.LittleEndian.AppendUint16(b, w)
	b = binary.LittleEndian.AppendUint16(b, h)
	return append(b, 0, 0, 0, ';')
}

// bombJPEG is a real small JPEG whose frame header (SOF0) is patched to
// claim w×h.
func bombJPEG(t testing.TB, w, h uint16) []byte {
	t.Helper()
	data := encodeJPEG(t, gradient(16, 16))
	i := bytes.Index(data, []byte{0xFF, 0xC0})
	require.Positive(t, i, "no SOF0 marker")
	// FF C0, length (2), precision (1), height (2), width (2).
	binary.BigEndian.PutUint16(data[i+5:], h)
	binary.BigEndian.PutUint16(data[i+7:], w)
	return data
}

// golden collects the rendered results of a table's cases and compares them
// with testdata/<name>.golden.json, one JSON object keyed by case name. A run
// filtered with -run compares the cases it ran: the others are taken from the
// file as they stand.
type golden struct {
	mu      sync.Mutex
	results map[string]jsontext.Value
}

func (g *golden) add(t testing.TB, name string, res attachment.Result) {
	t.Helper()
	js, err := res.JSON()
	require.NoError(t, err)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.results == nil {
		g.results = map[string]jsontext.Value{}
	}
	g.results[name] = js
}

func (g *golden) check(t *testing.T, name string, cases int) {
	t.Helper()
	if t.Failed() {
		return // missing cases would only add noise
	}
	file := name + ".golden.json"
	all := g.results
	if len(all) < cases {
		all = map[string]jsontext.Value{}
		if raw, err := os.ReadFile(filepath.Join("testdata", file)); err == nil {
			require.NoError(t, json.Unmarshal(raw, &all))
		}
		maps.Copy(all, g.results)
	}
	out, err := json.Marshal(all, json.Deterministic(true), jsontext.Multiline(true), jsontext.WithIndent("  "))
	require.NoError(t, err)
	testkit.Golden(t, file, append(out, '\n'))
}

// progressiveJPEG is a grayscale progressive JPEG of w×h pixels (w, h <
// 65536) made of the given number of AC scans, each of which skips every
// block with end-of-band runs of 32,767 blocks — two bytes per run. The
// image is uniform grey; the point is the decoder's work, which is
// proportional to scans × blocks while the file stays tiny.
func progressiveJPEG(w, h, scans int) []byte {
	var b bytes.Buffer
	segment := func(marker byte, payload ...byte) {
		b.Write([]byte{0xFF, marker, byte((len(payload) + 2) >> 8), byte(len(payload) + 2)})
		b.Write(payload)
	}
	b.Write([]byte{0xFF, 0xD8})                                         // SOI
	segment(0xDB, append([]byte{0}, bytes.Repeat([]byte{1}, 64)...)...) // DQT 0
	segment(0xC2, 8, byte(h>>8), byte(h), byte(w>>8), byte(w), 1, 1, 0x11, 0)
	// DHT, AC table 0: a single 1-bit code "0" for EOB14 (0xE0).
	segment(0xC4, 0x10, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xE0)
	blocks := ((w + 7) / 8) * ((h + 7) / 8)
	for range scans {
		segment(0xDA, 1, 1, 0x00, 1, 63, 0) // SOS: component 1, coefficients 1–63
		var acc, n uint
		bit := func(v uint) {
			acc, n = acc<<1|v, n+1
			if n == 8 {
				b.WriteByte(byte(acc))
				if byte(acc) == 0xFF {
					b.WriteByte(0) // byte stuffing
				}
				acc, n = 0, 0
			}
		}
		for covered := 0; covered < blocks; covered += 32767 {
			bit(0) // EOB14, then 14 bits: a run of 2^14 + 16383 = 32767 blocks
			for range 14 {
				bit(1)
			}
		}
		for n != 0 {
			bit(1) // pad with ones
		}
	}
	b.Write([]byte{0xFF, 0xD9}) // EOI
	return b.Bytes()
}
