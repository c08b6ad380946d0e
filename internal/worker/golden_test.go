package worker_test

import (
	"bytes"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/worker"
)

func jpegOf(t testing.TB, w, h int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{uint8(x * 3), uint8(y * 5), 90, 255})
		}
	}
	var b bytes.Buffer
	require.NoError(t, jpeg.Encode(&b, img, &jpeg.Options{Quality: 80}))
	return b.Bytes()
}

func gifOf(t testing.TB, w, h int) []byte {
	img := image.NewPaletted(image.Rect(0, 0, w, h), []color.Color{color.Black, color.White})
	for y := range h {
		for x := range w {
			img.SetColorIndex(x, y, uint8((x+y)%2))
		}
	}
	var b bytes.Buffer
	require.NoError(t, gif.Encode(&b, img, nil))
	return b.Bytes()
}

// Through the whole pipeline (API service → outbox → relay → JetStream →
// worker → PostgreSQL), the stored results — thumbnail dimensions, text
// statistics, detected types — and the thumbnails' real sizes match
// testdata/pipeline.golden.json (go test ./internal/worker/ -run Golden -update rewrites it).
func TestGoldenResultsThroughWorker(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startWorker(h.config(), "")
	cases := []struct {
		name, contentType string
		data              []byte
	}{
		{"png-1000x500", "image/png", pngOf(t, 1000, 500)},
		{"png-100x300", "image/png", pngOf(t, 100, 300)},
		{"png-small-40x30", "image/png", pngOf(t, 40, 30)},
		{"jpeg-640x480", "image/jpeg", jpegOf(t, 640, 480)},
		{"gif-300x10", "image/gif", gifOf(t, 300, 10)},
		{"text-bench-4k", "text/plain", attachment.BenchFixtureText4K()},
		{"text-crlf-unicode", "text/plain", []byte("première ligne\r\nzweite  Zeile\n\tdrei\u00a0vier")},
		{"text-empty", "text/plain", []byte{}},
		{"binary", "application/octet-stream", []byte{0, 1, 2, 3, 0xff, 0xfe}},
		{"png-declared-as-text", "text/plain", pngOf(t, 512, 512)},
	}
	ids := map[string]uuid.UUID{}
	for _, c := range cases {
		ids[c.name] = h.create(c.name, c.contentType, c.data)
	}
	type entry struct {
		Result    jsontext.Value `json:"result"`
		Thumbnail *[2]int        `json:"thumbnail_png_size"`
	}
	got := map[string]entry{}
	for _, c := range cases {
		r := h.waitStatus(ids[c.name], worker.StateProcessed)
		e := entry{Result: r.Result}
		if r.Thumbnail != nil {
			cfg, err := png.DecodeConfig(bytes.NewReader(r.Thumbnail))
			require.NoError(t, err, c.name)
			e.Thumbnail = &[2]int{cfg.Width, cfg.Height}
		}
		got[c.name] = e
	}
	b, err := json.Marshal(got, json.Deterministic(true))
	require.NoError(t, err)
	require.NoError(t, (*jsontext.Value)(&b).Indent())
	testkit.Golden(t, "pipeline.golden.json", append(b, '\n'))
}
