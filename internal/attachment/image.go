package attachment

import (
	"bytes"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"sync"

	"golang.org/x/image/draw"
)

// codec is the decoder of one image format. The decoders are called
// directly, not through image.Decode's registry, so that a format some other
// package registers can never be reached through an attachment.
type codec struct {
	decodeConfig func(io.Reader) (image.Config, error)
	decode       func(io.Reader) (image.Image, error)
}

// sosMarker starts a JPEG scan.
var sosMarker = []byte{0xFF, 0xDA}

var codecs = map[string]codec{
	TypePNG:  {png.DecodeConfig, png.Decode},
	TypeJPEG: {jpeg.DecodeConfig, jpeg.Decode},
	TypeGIF:  {gif.DecodeConfig, gif.Decode}, // the first frame
}

// thumbnail decodes an image of type typ, refusing one over the limits
// before decoding it, and renders its thumbnail.
func thumbnail(typ string, data []byte, lim Limits) (*Thumbnail, error) {
	maxPixels := lim.MaxPixels
	c := codecs[typ]
	cfg, err := c.decodeConfig(bytes.NewReader(data))
	if err != nil {
		return nil, permanent(ErrCorruptImage, "%s header: %v", typ, err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return nil, permanent(ErrCorruptImage, "%s header: empty image %dx%d", typ, cfg.Width, cfg.Height)
	}
	// Each side is checked first so that the product cannot overflow.
	if int64(cfg.Width) > maxPixels || int64(cfg.Height) > maxPixels ||
		int64(cfg.Width)*int64(cfg.Height) > maxPixels {
		return nil, permanent(ErrImageTooLarge, "%dx%d is %d pixels, the limit is %d (not decoded)",
			cfg.Width, cfg.Height, uint64(cfg.Width)*uint64(cfg.Height), maxPixels)
	}
	if lim.DecodeMemory > 0 {
		if need := decodeWeight(typ, data, cfg); need > lim.DecodeMemory {
			return nil, permanent(ErrImageTooLarge, "%dx%d %s needs %d bytes to decode, the budget is %d (not decoded)",
				cfg.Width, cfg.Height, typ, need, lim.DecodeMemory)
		}
	}
	if typ == TypeJPEG {
		// Every SOS marker the decoder acts on is the byte pair FF DA
		// (fill bytes may precede it, but only FF ones), so this count
		// is an upper bound that no arrangement of the file can evade.
		if n := bytes.Count(data, sosMarker); n > lim.MaxJPEGScans {
			return nil, permanent(ErrImageTooLarge, "image/jpeg has %d scans, the limit is %d (not decoded)", n, lim.MaxJPEGScans)
		}
	}

	img, err := decode(c, data)
	if err != nil {
		return nil, permanent(ErrCorruptImage, "%s: %v", typ, err)
	}
	b := img.Bounds()
	if b.Empty() {
		return nil, permanent(ErrCorruptImage, "%s: empty image", typ)
	}
	w, h := thumbSize(b.Dx(), b.Dy(), ThumbnailMaxSide)
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	if w == b.Dx() && h == b.Dy() {
		draw.Draw(dst, dst.Bounds(), img, b.Min, draw.Src)
	} else {
		draw.CatmullRom.Scale(dst, dst.Bounds(), img, b, draw.Src, nil)
	}

	var buf bytes.Buffer
	if err := pngEncoder.Encode(&buf, dst); err != nil {
		// Unreachable: encoding a valid *image.RGBA into memory.
		return nil, fmt.Errorf("attachment: encode thumbnail: %w", err)
	}
	return &Thumbnail{Width: w, Height: h, PNG: buf.Bytes()}, nil
}

// decode runs the decoder, turning a panic inside it into an error: a
// decoder that panics on some input panics on it every time, so the content
// can never succeed, and it must not take the worker down.
func decode(c codec, data []byte) (img image.Image, err error) {
	defer func() {
		if p := recover(); p != nil {
			img, err = nil, fmt.Errorf("decoder panic: %v", p)
		}
	}()
	return c.decode(bytes.NewReader(data))
}

// thumbSize returns the size of the thumbnail of a w×h image: the same size
// when both sides are at most maxSide; otherwise the longer side is maxSide
// and the shorter is scaled by the same factor, rounded to the nearest
// integer (halves up), and at least 1.
func thumbSize(w, h, maxSide int) (int, int) {
	switch {
	case w <= maxSide && h <= maxSide:
		return w, h
	case w >= h:
		return maxSide, max(1, (h*maxSide+w/2)/w)
	default:
		return max(1, (w*maxSide+h/2)/h), maxSide
	}
}

// pngEncoder writes thumbnails. BestSpeed, because encoding dominates the
// processing time and BestSpeed is much faster than the default level for a
// somewhat larger thumbnail. The pool reuses the encoder's buffers.
var pngEncoder = png.Encoder{CompressionLevel: png.BestSpeed, BufferPool: &encoderPool{}}

type encoderPool struct{ p sync.Pool }

func (e *encoderPool) Get() *png.EncoderBuffer {
	b, _ := e.p.Get().(*png.EncoderBuffer)
	return b
}

func (e *encoderPool) Put(b *png.EncoderBuffer) { e.p.Put(b) }
