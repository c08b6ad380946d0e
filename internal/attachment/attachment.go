// Package attachment is the pure processing step of Quill's attachment worker
// (SPEC §7): given an attachment's bytes and the size and SHA-256 the API
// recorded for them, it verifies them, detects the real content type and
// produces the result the API serves under GET /v1/notes/{id}/attachment — a
// PNG thumbnail for images, line and word counts and a preview for text,
// metadata only for everything else.
//
// The package touches no database, broker or file: Process is a function of
// its arguments, safe for concurrent use, and gives the same answer for the
// same input every time. That determinism is what makes the worker's
// at-least-once delivery harmless here: reprocessing a redelivered event
// reproduces the same result.
//
// # Content type detection
//
// The declared content type and filename are claims made by the client; they
// are never consulted. The type is decided from the bytes alone, in this
// order:
//
//  1. Text: the whole of the data is valid UTF-8 and contains no NUL byte
//     (the empty attachment included). The detected type is what
//     net/http.DetectContentType says when that is a text/ type
//     ("text/html; charset=utf-8", "text/xml; charset=utf-8", ...), and
//     "text/plain; charset=utf-8" otherwise. Text wins over any other
//     signature DetectContentType may match: an all-ASCII file that begins
//     with "%PDF-" or "%!PS-Adobe-" is counted as the text it is.
//  2. Images by magic number: PNG (89 50 4E 47 0D 0A 1A 0A), JPEG (FF D8 FF)
//     and GIF ("GIF87a" or "GIF89a") are "image/png", "image/jpeg" and
//     "image/gif" and get a thumbnail. Checking text first never hides an
//     image: the PNG and JPEG signatures are not valid UTF-8, and every
//     well-formed GIF contains a NUL byte (the block terminator), so only a
//     text that merely begins with "GIF89a" is affected — and it is text.
//  3. Anything else: net/http.DetectContentType's answer ("application/pdf",
//     "image/webp", "application/zip", "application/octet-stream", ...),
//     metadata only. DetectContentType sniffs only the first 512 bytes and
//     does not validate UTF-8, so when it answers a text/ type for data that
//     rule 1 rejected (invalid UTF-8, a NUL byte, a UTF-16 byte order mark)
//     the detected type is "application/octet-stream" instead. Hence the
//     invariant: DetectedType starts with "text/" exactly when Text is set.
//
// # Failures
//
// Content that can never be processed — a size or SHA-256 that does not match
// the declared one, a corrupt image, an image that would cost more to decode
// than Limits allow (a decompression bomb) — is reported as a
// *PermanentError: the worker marks the
// attachment failed with its Reason and acknowledges the event. Any other
// error (an invalid Limits value) says nothing about the content; the worker
// treats it as transient. Tell them apart with errors.As (see the example of
// Process).
package attachment

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Content types Process reports itself; any other DetectedType is
// net/http.DetectContentType's.
const (
	TypePNG  = "image/png"
	TypeJPEG = "image/jpeg"
	TypeGIF  = "image/gif"
	// TypeText is the detected type of UTF-8 text that net/http does not
	// identify more precisely (as HTML or XML).
	TypeText = "text/plain; charset=utf-8"
	// TypeOctetStream is the detected type of unidentified binary data.
	TypeOctetStream = "application/octet-stream"
)

// Fixed properties of a result (SPEC §7).
const (
	// ThumbnailMaxSide is the longest side, in pixels, of a thumbnail.
	ThumbnailMaxSide = 256
	// PreviewMaxChars is the length of a text preview in Unicode code points.
	PreviewMaxChars = 500
)

// DefaultMaxPixels is the pixel limit used when Limits.MaxPixels is zero: 40
// megapixels. Decoding holds the whole image in memory: up to 4 bytes per
// pixel for 8-bit PNGs (160 MB at this limit), 8 for 16-bit PNGs, 1 for GIFs,
// 3 for baseline JPEGs and up to 15 for progressive ones (4 bytes per
// coefficient kept between scans, plus the image) — so a worker running N
// decodes at once needs N times that; the worker bounds the sum with its
// decode budget (DecodeMemory, Limits.DecodeMemory).
const DefaultMaxPixels = 40_000_000

// Input is one attachment to process: the values the API recorded in the
// note.created event and the stored bytes.
type Input struct {
	// ContentType is the content type the client declared. Detection does not
	// trust it (see the package documentation).
	ContentType string
	// Filename is the filename the client declared; informational.
	Filename string
	// Size is the declared size in bytes; it must equal len(Data).
	Size int
	// SHA256 is the declared SHA-256 of Data in hex (either case); it must
	// match.
	SHA256 string
	// Data is the attachment's content.
	Data []byte
}

// DefaultMaxJPEGScans is the scan limit used when Limits.MaxJPEGScans is
// zero. Encoders write one scan per component for a baseline JPEG and about
// ten for a progressive one (libjpeg's default script).
const DefaultMaxJPEGScans = 100

// Limits bounds the work Process does for one attachment. The zero value
// means the defaults.
type Limits struct {
	// MaxPixels is the largest width×height of an image that is decoded;
	// a larger one is refused, before decoding, as a decompression bomb.
	// Zero means DefaultMaxPixels; negative is an error.
	MaxPixels int64
	// MaxJPEGScans is the largest number of scans (SOS markers) of a JPEG
	// that is decoded; one with more is refused before decoding. The
	// decoder visits every block of the image in every scan, and a
	// progressive scan can skip 32,767 blocks in two bytes, so without this
	// limit a JPEG of a few kilobytes can cost minutes of CPU; the default
	// keeps the worst case within seconds. Zero means DefaultMaxJPEGScans;
	// negative is an error.
	MaxJPEGScans int
	// DecodeMemory is the most bytes an image may need to decode (its
	// DecodeMemory weight); a heavier one is refused, before decoding, as
	// too large. It is the worker's whole decode budget
	// (QUILL_WORKER_DECODE_MEMORY): an image that could never be admitted
	// under it fails for good instead of waiting for ever. Zero means no
	// such limit; negative is an error.
	DecodeMemory int64
}

// ErrInvalidLimits is returned, wrapped, for a Limits value Process cannot
// use. It is not a *PermanentError: the configuration is wrong, not the
// content.
var ErrInvalidLimits = errors.New("attachment: invalid limits")

func (l Limits) withDefaults() (Limits, error) {
	if l.MaxPixels < 0 {
		return l, fmt.Errorf("%w: MaxPixels is %d", ErrInvalidLimits, l.MaxPixels)
	}
	if l.MaxJPEGScans < 0 {
		return l, fmt.Errorf("%w: MaxJPEGScans is %d", ErrInvalidLimits, l.MaxJPEGScans)
	}
	if l.DecodeMemory < 0 {
		return l, fmt.Errorf("%w: DecodeMemory is %d", ErrInvalidLimits, l.DecodeMemory)
	}
	if l.MaxPixels == 0 {
		l.MaxPixels = DefaultMaxPixels
	}
	if l.MaxJPEGScans == 0 {
		l.MaxJPEGScans = DefaultMaxJPEGScans
	}
	return l, nil
}

// Result is the outcome of processing an attachment. Thumbnail is set for
// images, Text for text, neither for other types.
type Result struct {
	// DetectedType is the content type detected from the bytes.
	DetectedType string `json:"detected_type"`
	// Thumbnail is the PNG thumbnail of an image, or nil.
	Thumbnail *Thumbnail `json:"thumbnail"`
	// Text holds the statistics of a text, or nil.
	Text *TextStats `json:"text"`
}

// Thumbnail is a PNG rendering of an image, at most ThumbnailMaxSide pixels
// on its longer side, with the image's aspect ratio (see Process for the
// rounding).
type Thumbnail struct {
	Width  int `json:"width"`
	Height int `json:"height"`
	// PNG is the encoded thumbnail. It is served by
	// GET /v1/notes/{id}/attachment/thumbnail and is not part of the JSON
	// result.
	PNG []byte `json:"-"`
}

// TextStats are the statistics of a UTF-8 text.
type TextStats struct {
	// Lines counts like wc -l (newline bytes, so CRLF is one line break and
	// a lone CR is none), plus one for a last line without a trailing
	// newline: "" has 0 lines, "a" 1, "a\n" 1, "a\nb" 2.
	Lines int `json:"lines"`
	// Words counts like wc -w: maximal runs of characters that are not
	// Unicode white space (unicode.IsSpace, the rule of strings.Fields).
	Words int `json:"words"`
	// Preview is the first PreviewMaxChars code points of the text, exactly
	// as sent (no trimming or normalization); it is never cut inside a UTF-8
	// sequence.
	Preview string `json:"preview"`
}

// JSON renders r as the SPEC's result object (SPEC §3):
//
//	{"detected_type": "...", "thumbnail": {"width", "height"} | null,
//	 "text": {"lines", "words", "preview"} | null}
//
// Members appear in that order; the output is the same for equal results. The
// thumbnail's PNG bytes are not included. It fails only if Preview is not
// valid UTF-8, which Process never produces.
func (r Result) JSON() (jsontext.Value, error) {
	b, err := json.Marshal(r, json.Deterministic(true))
	if err != nil {
		return nil, fmt.Errorf("attachment: render result: %w", err)
	}
	return b, nil
}

// Categories of permanent failure; a *PermanentError unwraps to one of them,
// so errors.Is(err, ErrCorruptImage) works on Process's error.
var (
	// ErrSizeMismatch: len(Data) differs from the declared size.
	ErrSizeMismatch = errors.New("size mismatch")
	// ErrHashMismatch: the SHA-256 of Data differs from the declared one, or
	// the declared one is not 64 hex digits.
	ErrHashMismatch = errors.New("sha256 mismatch")
	// ErrCorruptImage: the data has an image signature but does not decode.
	ErrCorruptImage = errors.New("corrupt image")
	// ErrImageTooLarge: decoding the image would cost more than Limits
	// allow — its width×height exceeds MaxPixels (a decompression bomb),
	// its DecodeMemory weight exceeds Limits.DecodeMemory or, for a JPEG,
	// its scans exceed MaxJPEGScans; it was not decoded.
	ErrImageTooLarge = errors.New("image too large")
)

// PermanentError reports content that can never be processed: retrying the
// same bytes gives the same failure. The worker marks the attachment failed
// with Reason instead of retrying.
type PermanentError struct {
	// Reason is a short human-readable explanation, suitable for the
	// attachment's reason (it never contains the attachment's bytes).
	Reason string
	// Err is the category: ErrSizeMismatch, ErrHashMismatch,
	// ErrCorruptImage or ErrImageTooLarge.
	Err error
}

// Error implements error.
func (e *PermanentError) Error() string { return "attachment: " + e.Reason }

// Unwrap returns the category, for errors.Is.
func (e *PermanentError) Unwrap() error { return e.Err }

func permanent(category error, format string, args ...any) *PermanentError {
	return &PermanentError{Reason: category.Error() + ": " + fmt.Sprintf(format, args...), Err: category}
}

// Process verifies, classifies and processes one attachment.
//
// It checks len(in.Data) against in.Size, then the SHA-256 against in.SHA256;
// a mismatch is a *PermanentError (ErrSizeMismatch, ErrHashMismatch). It then
// detects the content type from the bytes (see the package documentation)
// and:
//
//   - PNG, JPEG, GIF: reads the image header first and refuses, without
//     decoding, an image whose width×height exceeds lim.MaxPixels, whose
//     DecodeMemory weight exceeds lim.DecodeMemory (when set), or a JPEG
//     with more than lim.MaxJPEGScans scans (*PermanentError,
//     ErrImageTooLarge). Otherwise it decodes the image — a decoding error,
//     or a panic of the decoder, is a *PermanentError, ErrCorruptImage; a
//     GIF's first frame is used; EXIF orientation is not applied — and
//     returns a PNG thumbnail. An image at most ThumbnailMaxSide pixels on
//     both sides keeps its size (it is re-encoded, never upscaled). A larger
//     one is scaled so that its longer side is ThumbnailMaxSide and its
//     shorter side is shorter×ThumbnailMaxSide/longer rounded to the nearest
//     integer (halves up), at least 1: 1000×500 → 256×128, 100×300 → 85×256,
//     10000×10 → 256×1. Scaling uses the Catmull-Rom kernel of
//     golang.org/x/image/draw, which widens with the reduction factor and so
//     averages every source pixel instead of sampling a few (ApproxBiLinear
//     reads 4 pixels per output pixel, which aliases badly when, say, a
//     4000-pixel photo becomes 256); its cost stays bounded because the
//     source is at most lim.MaxPixels (its temporary buffer, 32 bytes ×
//     thumbnail width × source height, is at most 52 MB at the default
//     limit).
//   - text: counts lines and words and takes a preview (see TextStats).
//   - anything else: only DetectedType is set.
//
// An error that is not a *PermanentError is not the content's fault: an
// invalid lim (ErrInvalidLimits), or a failure to encode the thumbnail in
// memory, which cannot happen in practice. Process does not retain or modify
// in.Data.
func Process(in Input, lim Limits) (Result, error) {
	lim, err := lim.withDefaults()
	if err != nil {
		return Result{}, err
	}
	if err := verify(in); err != nil {
		return Result{}, err
	}
	typ, kind := detect(in.Data)
	res := Result{DetectedType: typ}
	switch kind {
	case kindImage:
		th, err := thumbnail(typ, in.Data, lim)
		if err != nil {
			return Result{}, err
		}
		res.Thumbnail = th
	case kindText:
		res.Text = textStats(in.Data)
	}
	return res, nil
}

// verify checks the data against the declared size and SHA-256.
func verify(in Input) error {
	if in.Size != len(in.Data) {
		return permanent(ErrSizeMismatch, "declared %d bytes, got %d", in.Size, len(in.Data))
	}
	want, err := hex.DecodeString(in.SHA256)
	if err != nil || len(want) != sha256.Size {
		return permanent(ErrHashMismatch, "the declared sha256 %q is not 64 hex digits", truncate(in.SHA256, 80))
	}
	got := sha256.Sum256(in.Data)
	if !bytes.Equal(want, got[:]) {
		return permanent(ErrHashMismatch, "declared %s, computed %x", strings.ToLower(in.SHA256), got)
	}
	return nil
}

// truncate cuts s to at most n bytes, for quoting a malformed value.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
