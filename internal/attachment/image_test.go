package attachment_test

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/color/palette"
	"image/png"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
)

func TestProcessImages(t *testing.T) {
	t.Parallel()
	paletted := image.NewPaletted(image.Rect(0, 0, 600, 400), palette.WebSafe)
	for i := range paletted.Pix {
		paletted.Pix[i] = uint8(i % len(palette.WebSafe))
	}
	gray := image.NewGray(image.Rect(0, 0, 320, 640))
	for i := range gray.Pix {
		gray.Pix[i] = uint8(i)
	}
	deep := image.NewRGBA64(image.Rect(0, 0, 300, 300))
	for i := range deep.Pix {
		deep.Pix[i] = uint8(i * 7)
	}
	translucent := image.NewNRGBA(image.Rect(0, 0, 512, 100))
	for i := range translucent.Pix {
		translucent.Pix[i] = uint8(i * 3)
	}

	tests := []struct {
		name     string
		format   string // png, jpeg, gif
		img      image.Image
		declared string
		wantW    int
		wantH    int
	}{
		{name: "png_1000x500", format: "png", img: gradient(1000, 500), declared: "image/png", wantW: 256, wantH: 128},
		{name: "png_100x300", format: "png", img: gradient(100, 300), declared: "image/png", wantW: 85, wantH: 256},
		{name: "png_10x10_not_upscaled", format: "png", img: gradient(10, 10), declared: "image/png", wantW: 10, wantH: 10},
		{name: "png_256x256_unchanged", format: "png", img: gradient(256, 256), declared: "image/png", wantW: 256, wantH: 256},
		{name: "png_257x257", format: "png", img: gradient(257, 257), declared: "image/png", wantW: 256, wantH: 256},
		{name: "png_257x100", format: "png", img: gradient(257, 100), declared: "image/png", wantW: 256, wantH: 100},
		{name: "png_1x1", format: "png", img: gradient(1, 1), declared: "image/png", wantW: 1, wantH: 1},
		{name: "png_3000x2_shorter_side_at_least_1", format: "png", img: gradient(3000, 2), declared: "image/png", wantW: 256, wantH: 1},
		{name: "png_rounding_half_up_512x3", format: "png", img: gradient(512, 3), declared: "image/png", wantW: 256, wantH: 2},
		{name: "png_16bit_300x300", format: "png", img: deep, declared: "image/png", wantW: 256, wantH: 256},
		{name: "png_translucent_512x100", format: "png", img: translucent, declared: "image/png", wantW: 256, wantH: 50},
		{name: "png_declared_text", format: "png", img: gradient(400, 300), declared: "text/plain", wantW: 256, wantH: 192},
		{name: "jpeg_1000x500", format: "jpeg", img: gradient(1000, 500), declared: "image/jpeg", wantW: 256, wantH: 128},
		{name: "jpeg_100x300", format: "jpeg", img: gradient(100, 300), declared: "image/jpeg", wantW: 85, wantH: 256},
		{name: "jpeg_gray_320x640", format: "jpeg", img: gray, declared: "image/jpeg", wantW: 128, wantH: 256},
		{name: "jpeg_10x10", format: "jpeg", img: gradient(10, 10), declared: "application/octet-stream", wantW: 10, wantH: 10},
		{name: "jpeg_progressive_2048x1024", format: "progressive_jpeg", img: image.Rect(0, 0, 2048, 1024), declared: "image/jpeg", wantW: 256, wantH: 128},
		{name: "gif_600x400", format: "gif", img: paletted, declared: "image/gif", wantW: 256, wantH: 171},
		{name: "gif_10x10", format: "gif", img: gradient(10, 10), declared: "image/gif", wantW: 10, wantH: 10},
		{name: "gif_declared_png_300x100", format: "gif", img: gradient(300, 100), declared: "image/png", wantW: 256, wantH: 85},
	}
	var g golden
	t.Run("cases", func(t *testing.T) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				var data []byte
				switch tc.format {
				case "progressive_jpeg":
					data = progressiveJPEG(tc.img.Bounds().Dx(), tc.img.Bounds().Dy(), 10)
					tc.format = "jpeg"
				case "png":
					data = encodePNG(t, tc.img)
				case "jpeg":
					data = encodeJPEG(t, tc.img)
				case "gif":
					data = encodeGIF(t, tc.img)
				}
				res, err := attachment.Process(inputOf(data, tc.declared), attachment.Limits{})
				require.NoError(t, err)
				require.Equal(t, "image/"+tc.format, res.DetectedType)
				require.Nil(t, res.Text)
				require.NotNil(t, res.Thumbnail)
				require.Equal(t, tc.wantW, res.Thumbnail.Width, "width")
				require.Equal(t, tc.wantH, res.Thumbnail.Height, "height")

				thumb, err := png.Decode(bytes.NewReader(res.Thumbnail.PNG))
				require.NoError(t, err, "the thumbnail is a PNG")
				require.Equal(t, image.Rect(0, 0, tc.wantW, tc.wantH), thumb.Bounds())
				g.add(t, tc.name, res)
			})
		}
	})
	g.check(t, "thumbnails", len(tests))
}

// TestThumbnailPixels checks what the thumbnail shows, not only its size: a
// scaled image keeps its colours where they were, and an image small enough
// is copied pixel for pixel.
func TestThumbnailPixels(t *testing.T) {
	t.Parallel()
	t.Run("scaled", func(t *testing.T) {
		t.Parallel()
		// Left half red, right half blue, 1000×500 → 256×128.
		img := image.NewNRGBA(image.Rect(0, 0, 1000, 500))
		for y := range 500 {
			for x := range 1000 {
				c := color.NRGBA{R: 255, A: 255}
				if x >= 500 {
					c = color.NRGBA{B: 255, A: 255}
				}
				img.SetNRGBA(x, y, c)
			}
		}
		res, err := attachment.Process(inputOf(encodePNG(t, img), "image/png"), attachment.Limits{})
		require.NoError(t, err)
		thumb, err := png.Decode(bytes.NewReader(res.Thumbnail.PNG))
		require.NoError(t, err)
		require.Equal(t, color.RGBAModel.Convert(color.NRGBA{R: 255, A: 255}), color.RGBAModel.Convert(thumb.At(10, 64)))
		require.Equal(t, color.RGBAModel.Convert(color.NRGBA{B: 255, A: 255}), color.RGBAModel.Convert(thumb.At(245, 64)))
	})
	t.Run("copied", func(t *testing.T) {
		t.Parallel()
		img := gradient(40, 30)
		res, err := attachment.Process(inputOf(encodePNG(t, img), "image/png"), attachment.Limits{})
		require.NoError(t, err)
		thumb, err := png.Decode(bytes.NewReader(res.Thumbnail.PNG))
		require.NoError(t, err)
		for y := range 30 {
			for x := range 40 {
				require.Equal(t, color.RGBAModel.Convert(img.At(x, y)), color.RGBAModel.Convert(thumb.At(x, y)), "pixel %d,%d", x, y)
			}
		}
	})
}

func TestProcessPermanentFailures(t *testing.T) {
	t.Parallel()
	good := encodePNG(t, gradient(64, 64))
	noisy := encodePNG(t, noise(64, 64))
	jpg := encodeJPEG(t, gradient(64, 64))
	gf := encodeGIF(t, gradient(64, 64))
	badCRC := bytes.Clone(good)
	badCRC[30] ^= 0xFF // inside IHDR's CRC (8 signature + 8 length/type + 13 data + 4 CRC)
	tenByEleven := encodePNG(t, gradient(10, 11))

	withSize := func(in attachment.Input, size int) attachment.Input { in.Size = size; return in }
	withHash := func(in attachment.Input, hash string) attachment.Input { in.SHA256 = hash; return in }
	flipped := func(hash string) string {
		b := []byte(hash)
		if b[0] == '0' {
			b[0] = '1'
		} else {
			b[0] = '0'
		}
		return string(b)
	}

	tests := []struct {
		name     string
		in       attachment.Input
		lim      attachment.Limits
		category error
		reason   string // a substring of Reason
	}{
		{name: "size_larger_than_declared", in: withSize(inputOf(good, "image/png"), len(good)-1), category: attachment.ErrSizeMismatch, reason: "size mismatch: declared"},
		{name: "size_smaller_than_declared", in: withSize(inputOf([]byte("hello"), "text/plain"), 6), category: attachment.ErrSizeMismatch, reason: "declared 6 bytes, got 5"},
		{name: "size_negative", in: withSize(inputOf(nil, "text/plain"), -1), category: attachment.ErrSizeMismatch},
		{name: "hash_mismatch", in: withHash(inputOf(good, "image/png"), flipped(inputOf(good, "").SHA256)), category: attachment.ErrHashMismatch, reason: "sha256 mismatch: declared"},
		{name: "hash_of_other_content", in: withHash(inputOf([]byte("a"), "text/plain"), inputOf([]byte("b"), "").SHA256), category: attachment.ErrHashMismatch},
		{name: "hash_not_hex", in: withHash(inputOf([]byte("a"), "text/plain"), "xyz"), category: attachment.ErrHashMismatch, reason: "not 64 hex digits"},
		{name: "hash_too_short", in: withHash(inputOf([]byte("a"), "text/plain"), inputOf([]byte("a"), "").SHA256[:62]), category: attachment.ErrHashMismatch},
		{name: "hash_empty", in: withHash(inputOf([]byte("a"), "text/plain"), ""), category: attachment.ErrHashMismatch},
		{name: "png_truncated_data", in: inputOf(noisy[:len(noisy)/2], "image/png"), category: attachment.ErrCorruptImage, reason: "corrupt image: image/png: "},
		{name: "png_signature_only", in: inputOf(good[:8], "image/png"), category: attachment.ErrCorruptImage, reason: "image/png header"},
		{name: "png_bad_crc", in: inputOf(badCRC, "image/png"), category: attachment.ErrCorruptImage},
		{name: "png_without_iend", in: inputOf(good[:len(good)-12], "image/png"), category: attachment.ErrCorruptImage},
		{name: "jpeg_truncated", in: inputOf(jpg[:len(jpg)/2], "image/jpeg"), category: attachment.ErrCorruptImage, reason: "image/jpeg"},
		{name: "jpeg_magic_only", in: inputOf([]byte{0xFF, 0xD8, 0xFF}, "image/jpeg"), category: attachment.ErrCorruptImage},
		{name: "gif_truncated", in: inputOf(gf[:len(gf)/2], "image/gif"), category: attachment.ErrCorruptImage, reason: "image/gif"},
		{name: "gif_zero_width", in: inputOf(bombGIF(0, 10), "image/gif"), category: attachment.ErrCorruptImage},
		{name: "bomb_png_50000x50000", in: inputOf(bombPNG(50000, 50000), "image/png"), category: attachment.ErrImageTooLarge, reason: "50000x50000 is 2500000000 pixels, the limit is 40000000 (not decoded)"},
		{name: "bomb_png_wide", in: inputOf(bombPNG(1<<31-1, 1), "image/png"), category: attachment.ErrImageTooLarge},
		{name: "bomb_gif_65535x65535", in: inputOf(bombGIF(65535, 65535), "image/gif"), category: attachment.ErrImageTooLarge},
		{name: "bomb_jpeg_65000x65000", in: inputOf(bombJPEG(t, 65000, 65000), "image/jpeg"), category: attachment.ErrImageTooLarge},
		{name: "jpeg_scan_bomb", in: inputOf(progressiveJPEG(4096, 4096, 1000), "image/jpeg"), category: attachment.ErrImageTooLarge, reason: "image/jpeg has 1000 scans, the limit is 100 (not decoded)"},
		{name: "jpeg_over_custom_scan_limit", in: inputOf(progressiveJPEG(64, 64, 11), "image/jpeg"), lim: attachment.Limits{MaxJPEGScans: 10}, category: attachment.ErrImageTooLarge, reason: "11 scans, the limit is 10"},
		{name: "over_custom_limit", in: inputOf(tenByEleven, "image/png"), lim: attachment.Limits{MaxPixels: 100}, category: attachment.ErrImageTooLarge, reason: "10x11 is 110 pixels, the limit is 100"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := attachment.Process(tc.in, tc.lim)
			require.Error(t, err)
			require.Zero(t, res)
			var perr *attachment.PermanentError
			require.True(t, errors.As(err, &perr), "want a *PermanentError, got %T: %v", err, err)
			require.ErrorIs(t, err, tc.category)
			require.NotEmpty(t, perr.Reason)
			require.Contains(t, perr.Reason, tc.reason)
			require.Equal(t, "attachment: "+perr.Reason, err.Error())
		})
	}
}

func TestProcessAtLimits(t *testing.T) {
	t.Parallel()
	res, err := attachment.Process(inputOf(encodePNG(t, gradient(10, 10)), "image/png"), attachment.Limits{MaxPixels: 100})
	require.NoError(t, err)
	require.Equal(t, 10, res.Thumbnail.Width)
	res, err = attachment.Process(inputOf(progressiveJPEG(64, 64, 10), "image/jpeg"), attachment.Limits{MaxJPEGScans: 10})
	require.NoError(t, err)
	require.Equal(t, 64, res.Thumbnail.Width)
}

func TestProcessInvalidLimits(t *testing.T) {
	t.Parallel()
	for _, lim := range []attachment.Limits{{MaxPixels: -1}, {MaxJPEGScans: -1}} {
		_, err := attachment.Process(inputOf([]byte("a"), "text/plain"), lim)
		require.ErrorIs(t, err, attachment.ErrInvalidLimits)
		var perr *attachment.PermanentError
		require.False(t, errors.As(err, &perr), "a configuration error is not the content's fault")
	}
}

// TestBombIsNotDecoded proves that bombs are refused before decoding: a PNG
// claiming 50000×50000 pixels (10 GB decoded) and a 35 KB JPEG of 1,000
// scans over 4096×4096 pixels (about 20 s of decoding) each cost next to no
// memory and time. It is deliberately not parallel, so that the process-wide
// allocation counter measures this test alone.
func TestBombIsNotDecoded(t *testing.T) {
	// Not parallel: it measures the heap, which other tests would grow.
	for _, bomb := range []struct {
		name string
		data []byte
	}{
		{"png_50000x50000", bombPNG(50000, 50000)},
		{"jpeg_1000_scans", progressiveJPEG(4096, 4096, 1000)},
	} {
		in := inputOf(bomb.data, "image/png")
		const calls = 20
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		for range calls {
			_, err := attachment.Process(in, attachment.Limits{})
			require.ErrorIs(t, err, attachment.ErrImageTooLarge)
		}
		elapsed := time.Since(start)
		runtime.ReadMemStats(&after)
		perCall := (after.TotalAlloc - before.TotalAlloc) / calls
		t.Logf("%s: %d bytes allocated and %v spent per refusal", bomb.name, perCall, elapsed/calls)
		require.Less(t, perCall, uint64(64<<10), "%s: bytes allocated per call", bomb.name)
		require.Less(t, elapsed/calls, 50*time.Millisecond, "%s: time per call", bomb.name)
	}
}

// noise is a w×h image that PNG cannot compress, so that truncating its
// encoding cuts into the pixel data.
func noise(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	x := uint32(2463534242)
	for i := range img.Pix {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		img.Pix[i] = uint8(x)
	}
	return img
}
