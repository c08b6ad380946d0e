package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
)

// Bomb geometry: the image bomb. 6320 × 6320 = 39.9 MP stays under
// the worker's 40 MP pixel limit (QUILL_MAX_PIXELS); at 16 bits per channel
// with alpha the decoder allocates 8 bytes a pixel, about 305 MiB, while the
// file, one colour repeated, deflates to about 330 KB: under the 1 MiB
// attachment limit.
const (
	bombSide          = 6320
	bombBytesPerPixel = 8
)

// uniformNRGBA64 is a w×h image of one 16-bit colour that is never stored:
// the encoder asks for each pixel, so generating a bomb costs no memory.
// Its colour model is NRGBA64 and it says it is not opaque, so image/png
// writes it as 16-bit truecolour with alpha (and skips its opacity scan).
type uniformNRGBA64 struct {
	c color.NRGBA64
	r image.Rectangle
}

func (u uniformNRGBA64) ColorModel() color.Model { return color.NRGBA64Model }
func (u uniformNRGBA64) Bounds() image.Rectangle { return u.r }
func (u uniformNRGBA64) At(int, int) color.Color { return u.c }
func (u uniformNRGBA64) Opaque() bool            { return false }

// makeBomb returns a PNG of a uniform 16-bit w×h image with alpha; an error
// only when w or h is not positive (image/png refuses an empty image).
func makeBomb(w, h int) ([]byte, error) {
	if w < 1 || h < 1 {
		return nil, fmt.Errorf("bomb of %d×%d pixels: both sides must be positive", w, h)
	}
	var b bytes.Buffer
	img := uniformNRGBA64{c: color.NRGBA64{R: 0x1234, G: 0x5678, B: 0x9abc, A: 0x8000}, r: image.Rect(0, 0, w, h)}
	if err := png.Encode(&b, img); err != nil {
		return nil, fmt.Errorf("encode a %d×%d bomb: %w", w, h, err)
	}
	return b.Bytes(), nil
}

// decodedBytes is what decoding a bomb of w×h allocates for its pixels.
func decodedBytes(w, h int) int64 { return int64(w) * int64(h) * bombBytesPerPixel }
