package attachment

import (
	"bytes"
	"image"
	"image/color"
)

// DecodeMemory returns an upper estimate of the bytes Process allocates to
// decode data's image and render its thumbnail, read from the image header
// alone (nothing is decoded): width × height × bytes per pixel of the
// decoded image, plus the decoder's and the scaler's temporary buffers. It
// returns 0 for data that is not a PNG, JPEG or GIF, and for an image whose
// header does not parse (Process refuses it before allocating anything).
//
// Bytes per pixel follow the header's color model: 8 for 16-bit RGBA, 4 for
// 8-bit RGBA and CMYK, 2 for 16-bit gray, 1 for gray and paletted images, 3
// for YCbCr (the decoder's 4:2:0 images take 1.5: an over-estimate). Where
// the decoder allocates more than the header says it is charged too: a PNG
// with a tRNS chunk decodes gray into NRGBA (4, or 8 for 16-bit gray), an
// interlaced PNG holds each pass beside the image (twice the pixels), a
// JPEG with four components builds its CMYK image from a YCbCr one (8), and
// a progressive JPEG keeps 4 bytes per coefficient of every component
// between scans.
//
// The worker admits decodes by this weight under QUILL_WORKER_DECODE_MEMORY
// (see Limits.DecodeMemory).
func DecodeMemory(data []byte) int64 {
	typ, k := detect(data)
	if k != kindImage {
		return 0
	}
	cfg, err := codecs[typ].decodeConfig(bytes.NewReader(data))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0
	}
	return decodeWeight(typ, data, cfg)
}

// decodeWeight is DecodeMemory for a parsed header.
func decodeWeight(typ string, data []byte, cfg image.Config) int64 {
	w, h := int64(cfg.Width), int64(cfg.Height)
	bpp := bytesPerPixel(cfg.ColorModel)
	factor := int64(1)
	switch typ {
	case TypePNG:
		if bytes.Contains(data, []byte("tRNS")) {
			// Gray with a transparent color decodes into NRGBA.
			switch cfg.ColorModel {
			case color.GrayModel:
				bpp = 4
			case color.Gray16Model:
				bpp = 8
			}
		}
		// IHDR's interlace method is the 13th byte of its data, which
		// starts after the signature and the chunk's length and type.
		if len(data) > 28 && data[28] != 0 {
			factor = 2
		}
	case TypeJPEG:
		comps := int64(1)
		switch cfg.ColorModel {
		case color.YCbCrModel:
			comps = 3
		case color.CMYKModel:
			comps, bpp = 4, 8
		}
		// SOF2 (progressive) can only appear as a marker, or in a
		// segment's payload: an upper bound.
		if bytes.Contains(data, []byte{0xFF, 0xC2}) {
			bpp += 4 * comps
		}
	}
	pixels := w * h
	total := pixels * bpp * factor
	tw, th := thumbSize(cfg.Width, cfg.Height, ThumbnailMaxSide)
	// The thumbnail, and when it is scaled the kernel's temporary buffer:
	// 4 float64 per thumbnail column and source row.
	total += 4 * int64(tw) * int64(th)
	if int64(tw) != w || int64(th) != h {
		total += 32 * int64(tw) * h
	}
	// The decoder's row buffers and the encoder's: a few rows of the
	// image, at most.
	total += 4 * 8 * w
	return total
}

// bytesPerPixel is the size of a pixel of the image a decoder returns for
// color model m.
func bytesPerPixel(m color.Model) int64 {
	switch m {
	case color.RGBA64Model, color.NRGBA64Model:
		return 8
	case color.RGBAModel, color.NRGBAModel, color.CMYKModel:
		return 4
	case color.YCbCrModel:
		return 3
	case color.Gray16Model, color.Alpha16Model:
		return 2
	case color.GrayModel, color.AlphaModel:
		return 1
	}
	if _, ok := m.(color.Palette); ok {
		return 1
	}
	// An unknown model: the widest.
	return 8
}
