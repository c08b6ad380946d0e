package httpapi_test

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
)

// testPNG encodes an opaque w×h image whose every pixel differs from its
// neighbours, so a thumbnail that is not this image's cannot pass for it.
func testPNG(t *testing.T, w, h int) (image.Image, []byte) {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, color.NRGBA{R: uint8(x * 255 / w), G: uint8(y * 255 / h), B: uint8((x + y) % 256), A: 0xff})
		}
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return img, buf.Bytes()
}

// createWithAttachment creates a note of tenant A with one attachment and
// returns the note's id and the attachment's id and sha256.
func (b *testBundle) createWithAttachment(key, filename, contentType string, data []byte) (noteID, attID, sha string) {
	b.t.Helper()
	r := b.create(b.tokenA, key, map[string]any{"title": key, "attachment": map[string]any{
		"filename": filename, "content_type": contentType, "data": base64.StdEncoding.EncodeToString(data)}})
	require.Equal(b.t, http.StatusCreated, r.status, "%s", r.body)
	n := r.json(b.t)
	att := n["attachment"].(map[string]any)
	return n["id"].(string), att["id"].(string), att["sha256"].(string)
}

// process runs the attachment through internal/attachment and stores its
// outcome with the statement the worker commits it with
// (internal/worker/commit.go, sqlAttachmentsDone), as a processed attachment.
// It returns the result.
func (b *testBundle) process(attID, sha, filename, contentType string, data []byte) attachment.Result {
	b.t.Helper()
	res, err := attachment.Process(attachment.Input{ContentType: contentType, Filename: filename,
		Size: len(data), SHA256: sha, Data: data}, attachment.Limits{})
	require.NoError(b.t, err)
	result, err := res.JSON()
	require.NoError(b.t, err)
	var thumb []byte
	if res.Thumbnail != nil {
		thumb = res.Thumbnail.PNG
	}
	_, err = b.pool.Exec(b.t.Context(), `UPDATE attachments a SET status = v.status, result = v.result::jsonb,
		reason = nullif(v.reason, ''), thumbnail = v.thumbnail, processed_at = now()
	FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[]) AS v(id, status, result, reason, thumbnail)
	WHERE a.id = v.id`,
		[]string{attID}, []string{"processed"}, []string{string(result)}, []string{""}, [][]byte{thumb})
	require.NoError(b.t, err)
	return res
}

// requireNotFound asserts r is the 404 not_found problem.
func requireNotFound(t *testing.T, r resp, msg string) {
	t.Helper()
	require.Equal(t, http.StatusNotFound, r.status, "%s: %s", msg, r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), msg)
	p := r.json(t)
	require.Equal(t, "not_found", p["code"], msg)
	require.Equal(t, 404.0, p["status"], msg)
	require.Equal(t, "no", p["retry"], msg)
}

// A processed image's thumbnail is served as stored: a PNG of the image's
// size (it is under the 256 px limit), with its length and nosniff, by GET
// and, without the body, by HEAD.
func TestThumbnailServesTheStoredPNG(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	src, data := testPNG(t, 40, 20)
	id, attID, sha := b.createWithAttachment("img", "wide.png", "image/png", data)
	path := "/v1/notes/" + id + "/attachment/thumbnail"

	// Pending: no thumbnail yet.
	requireNotFound(t, b.mustDo(req{method: http.MethodGet, path: path, token: b.tokenA}), "pending")

	res := b.process(attID, sha, "wide.png", "image/png", data)
	require.NotNil(t, res.Thumbnail)
	var stored []byte
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT thumbnail FROM attachments WHERE id = $1`, attID).Scan(&stored))
	require.NotEmpty(t, stored)

	r := b.mustDo(req{method: http.MethodGet, path: path, token: b.tokenA})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "image/png", r.header.Get("Content-Type"))
	require.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"))
	require.Equal(t, strconv.Itoa(len(stored)), r.header.Get("Content-Length"))
	require.Equal(t, stored, r.body, "the bytes stored, exactly")

	cfg, err := png.DecodeConfig(bytes.NewReader(r.body))
	require.NoError(t, err)
	require.Equal(t, [2]int{40, 20}, [2]int{cfg.Width, cfg.Height})
	got, err := png.Decode(bytes.NewReader(r.body))
	require.NoError(t, err)
	require.Equal(t, src.Bounds(), got.Bounds())
	for y := range 20 {
		for x := range 40 {
			require.Equal(t, color.RGBAModel.Convert(src.At(x, y)), color.RGBAModel.Convert(got.At(x, y)), "pixel (%d, %d)", x, y)
		}
	}

	// The metadata's result describes the PNG served.
	meta := b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + id + "/attachment", token: b.tokenA}).json(t)
	require.Equal(t, "processed", meta["status"])
	require.Equal(t, map[string]any{"width": 40.0, "height": 20.0}, meta["result"].(map[string]any)["thumbnail"])

	h := b.mustDo(req{method: http.MethodHead, path: path, token: b.tokenA})
	require.Equal(t, http.StatusOK, h.status)
	require.Equal(t, "image/png", h.header.Get("Content-Type"))
	require.Equal(t, "nosniff", h.header.Get("X-Content-Type-Options"))
	require.Equal(t, strconv.Itoa(len(stored)), h.header.Get("Content-Length"))
	require.Empty(t, h.body)
}

// Every note without a thumbnail to serve is 404 not_found (SPEC §3: "PNG,
// once processed; 404 otherwise"; other tenants' and deleted notes are 404
// not_found). The image cases are processed images that another request
// would be served: only the condition named stands in the way.
func TestThumbnailNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, img := testPNG(t, 40, 20)
	text := []byte("two lines\nof text\n")

	pending, _, _ := b.createWithAttachment("pending", "p.png", "image/png", img)

	txt, txtAtt, txtSHA := b.createWithAttachment("text", "t.txt", "text/plain; charset=utf-8", text)
	res := b.process(txtAtt, txtSHA, "t.txt", "text/plain; charset=utf-8", text)
	require.Nil(t, res.Thumbnail)
	require.NotNil(t, res.Text)

	other, otherAtt, otherSHA := b.createWithAttachment("other", "o.png", "image/png", img)
	b.process(otherAtt, otherSHA, "o.png", "image/png", img)
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + other + "/attachment/thumbnail", token: b.tokenA}).status)

	deleted, delAtt, delSHA := b.createWithAttachment("deleted", "d.png", "image/png", img)
	b.process(delAtt, delSHA, "d.png", "image/png", img)
	require.Equal(t, http.StatusOK, b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + deleted + "/attachment/thumbnail", token: b.tokenA}).status)
	d := b.mustDo(req{method: http.MethodDelete, path: "/v1/notes/" + deleted, token: b.tokenA, key: "del"})
	require.Equal(t, http.StatusOK, d.status, "%s", d.body)

	plain := b.create(b.tokenA, "plain", note("no attachment")).json(t)["id"].(string)

	for _, tc := range []struct {
		name, id, token, offContract string
	}{
		{name: "pending image", id: pending, token: b.tokenA},
		{name: "processed text", id: txt, token: b.tokenA},
		{name: "another tenant's note", id: other, token: b.tokenB},
		{name: "deleted note", id: deleted, token: b.tokenA},
		{name: "note without attachment", id: plain, token: b.tokenA},
		{name: "malformed id", id: "not-a-uuid", token: b.tokenA, offContract: "malformed id"},
	} {
		r := b.mustDo(req{method: http.MethodGet, path: "/v1/notes/" + tc.id + "/attachment/thumbnail", token: tc.token, offContract: tc.offContract})
		requireNotFound(t, r, tc.name)
	}
}
