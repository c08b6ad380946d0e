package attachment

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strconv"
	"strings"
	"testing"
)

func encodeSeed(tb testing.TB, typ string, img image.Image) []byte {
	tb.Helper()
	var buf bytes.Buffer
	var err error
	switch typ {
	case TypePNG:
		err = png.Encode(&buf, img)
	case TypeJPEG:
		err = jpeg.Encode(&buf, img, nil)
	case TypeGIF:
		err = gif.Encode(&buf, img, nil)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// pixBytes is the size of a decoded image's pixel buffers.
func pixBytes(img image.Image) int64 {
	switch m := img.(type) {
	case *image.RGBA:
		return int64(len(m.Pix))
	case *image.NRGBA:
		return int64(len(m.Pix))
	case *image.RGBA64:
		return int64(len(m.Pix))
	case *image.NRGBA64:
		return int64(len(m.Pix))
	case *image.Gray:
		return int64(len(m.Pix))
	case *image.Gray16:
		return int64(len(m.Pix))
	case *image.Alpha:
		return int64(len(m.Pix))
	case *image.Alpha16:
		return int64(len(m.Pix))
	case *image.Paletted:
		return int64(len(m.Pix))
	case *image.CMYK:
		return int64(len(m.Pix))
	case *image.YCbCr:
		return int64(len(m.Y) + len(m.Cb) + len(m.Cr))
	}
	return 0
}

func seeds(tb testing.TB) map[string][]byte {
	r := image.Rect(0, 0, 300, 20)
	return map[string][]byte{
		"png rgba64":  encodeSeed(tb, TypePNG, image.NewRGBA64(r)),
		"png nrgba":   encodeSeed(tb, TypePNG, image.NewNRGBA(r)),
		"png gray16":  encodeSeed(tb, TypePNG, image.NewGray16(r)),
		"png gray":    encodeSeed(tb, TypePNG, image.NewGray(r)),
		"png palette": encodeSeed(tb, TypePNG, image.NewPaletted(r, color.Palette{color.Black, color.White})),
		"jpeg ycbcr":  encodeSeed(tb, TypeJPEG, image.NewRGBA(r)),
		"jpeg gray":   encodeSeed(tb, TypeJPEG, image.NewGray(r)),
		"gif":         encodeSeed(tb, TypeGIF, image.NewPaletted(r, color.Palette{color.Black, color.White})),
	}
}

// The weight of each kind of image header: pixels × bytes per pixel of the
// decoded image, plus the thumbnail's buffers; it is never below what the
// decoder really allocated.
func TestDecodeMemory(t *testing.T) {
	t.Parallel()
	// 300×20 scales to 256×17: a 256×17 RGBA thumbnail, a 256×20 kernel
	// buffer of 32 bytes, and 32 bytes per source column of row buffers.
	extra := int64(4*256*17 + 32*256*20 + 32*300)
	want := map[string]int64{
		"png rgba64": 8*6000 + extra, "png nrgba": 4*6000 + extra, "png gray16": 2*6000 + extra,
		"png gray": 6000 + extra, "png palette": 6000 + extra, "jpeg ycbcr": 3*6000 + extra,
		"jpeg gray": 6000 + extra, "gif": 6000 + extra,
	}
	for name, data := range seeds(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := DecodeMemory(data)
			if got != want[name] {
				t.Errorf("DecodeMemory = %d, want %d", got, want[name])
			}
			typ, _ := detect(data)
			img, err := codecs[typ].decode(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if p := pixBytes(img); p > got {
				t.Errorf("decoded %d bytes of pixels, more than the weight %d", p, got)
			}
		})
	}
	for _, data := range [][]byte{nil, []byte("text"), []byte("\x89PNG\r\n\x1a\ncorrupt"), {0xFF, 0xD8, 0xFF, 0}} {
		if got := DecodeMemory(data); got != 0 {
			t.Errorf("DecodeMemory(%q) = %d, want 0", data, got)
		}
	}
}

// An image whose weight exceeds Limits.DecodeMemory is refused as too large,
// with the weight and the budget in the reason; one within it is processed.
func TestProcessDecodeMemoryBudget(t *testing.T) {
	t.Parallel()
	data := seeds(t)["png rgba64"]
	need := DecodeMemory(data)
	in := Input{Size: len(data), SHA256: sha256Hex(data), Data: data}
	_, err := Process(in, Limits{DecodeMemory: need - 1})
	var perr *PermanentError
	if !errors.As(err, &perr) || !errors.Is(err, ErrImageTooLarge) {
		t.Fatalf("err = %v, want a permanent ErrImageTooLarge", err)
	}
	if want := "needs " + itoa(need) + " bytes to decode, the budget is " + itoa(need-1); !strings.Contains(perr.Reason, want) {
		t.Errorf("reason %q does not say %q", perr.Reason, want)
	}
	if _, err := Process(in, Limits{DecodeMemory: need}); err != nil {
		t.Errorf("within the budget: %v", err)
	}
	if _, err := Process(in, Limits{DecodeMemory: -1}); !errors.Is(err, ErrInvalidLimits) {
		t.Errorf("negative budget: %v, want ErrInvalidLimits", err)
	}
}

// FuzzDecodeMemory: the header weight never panics, and for every input
// that decodes it is at least the decoded image's pixel bytes — the
// admission under the worker's budget never under-counts an image. Inputs
// over a megapixel are not decoded (the fuzzer would spend its time in
// allocation).
func FuzzDecodeMemory(f *testing.F) {
	for _, data := range seeds(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := DecodeMemory(data)
		if got < 0 {
			t.Fatalf("negative weight %d", got)
		}
		typ, k := detect(data)
		if k != kindImage {
			if got != 0 {
				t.Fatalf("weight %d for a %s", got, typ)
			}
			return
		}
		cfg, err := codecs[typ].decodeConfig(bytes.NewReader(data))
		if err != nil || cfg.Width <= 0 || cfg.Height <= 0 || int64(cfg.Width)*int64(cfg.Height) > 1<<20 {
			return
		}
		img, err := decode(codecs[typ], data)
		if err != nil {
			return
		}
		if p := pixBytes(img); p > got {
			t.Fatalf("%s %dx%d %T: decoded %d bytes of pixels, the weight is %d", typ, cfg.Width, cfg.Height, img, p, got)
		}
	})
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
