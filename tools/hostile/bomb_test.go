package main

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/png"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
	"github.com/quillhq/quill/internal/httpapi"
)

// TestMakeBomb: the bomb is a 16-bit RGBA PNG of the size asked for, and
// the real one passes every limit the API and the worker check before
// decoding — under the attachment and body limits, under the pixel limit —
// while decoding into more than the whole default decode budget.
func TestMakeBomb(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		w, h    int
		wantErr bool
		real    bool
	}{
		{name: "one pixel", w: 1, h: 1},
		{name: "wide strip", w: 1000, h: 3},
		{name: "the issue's bomb", w: bombSide, h: bombSide, real: true},
		{name: "no width", w: 0, h: 10, wantErr: true},
		{name: "negative height", w: 10, h: -1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.real && testing.Short() {
				t.Skip("encodes 305 MiB of pixels")
			}
			b, err := makeBomb(tc.w, tc.h)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			cfg, format, err := image.DecodeConfig(bytes.NewReader(b))
			require.NoError(t, err)
			require.Equal(t, "png", format)
			require.Equal(t, tc.w, cfg.Width)
			require.Equal(t, tc.h, cfg.Height)
			require.Equal(t, color.NRGBA64Model, cfg.ColorModel, "16 bits per channel with alpha: 8 bytes a pixel decoded")
			if !tc.real {
				img, err := png.Decode(bytes.NewReader(b))
				require.NoError(t, err)
				require.Equal(t, color.NRGBA64{R: 0x1234, G: 0x5678, B: 0x9abc, A: 0x8000}, img.At(tc.w-1, tc.h-1))
				return
			}
			require.Less(t, len(b), 1<<20, "under QUILL_MAX_ATTACHMENT_BYTES' default")
			require.Less(t, base64.StdEncoding.EncodedLen(len(b))+200, httpapi.DefaultMaxBodyBytes, "its request under QUILL_MAX_BODY_BYTES' default")
			require.LessOrEqual(t, int64(cfg.Width)*int64(cfg.Height), int64(attachment.DefaultMaxPixels), "under the pixel limit")
			require.Greater(t, decodedBytes(cfg.Width, cfg.Height), int64(defaultDecodeBudget), "over the whole default decode budget")
			require.Greater(t, decodedBytes(cfg.Width, cfg.Height), int64(300<<20), "the issue's ~305 MiB")
		})
	}
}
