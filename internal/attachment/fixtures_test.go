package attachment_test

import (
	"bytes"
	"image/png"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/attachment"
)

func TestBenchFixtures(t *testing.T) {
	t.Parallel()
	t.Run("png64k", func(t *testing.T) {
		t.Parallel()
		a, b := attachment.BenchFixturePNG64K(), attachment.BenchFixturePNG64K()
		require.Equal(t, a, b, "deterministic")
		a[100] ^= 0xFF
		require.NotEqual(t, a, attachment.BenchFixturePNG64K(), "each call returns its own copy")
		require.InDelta(t, 64<<10, len(b), 4<<10, "about 64 KiB")
		cfg, err := png.DecodeConfig(bytes.NewReader(b))
		require.NoError(t, err)
		require.Equal(t, [2]int{392, 294}, [2]int{cfg.Width, cfg.Height})
		res, err := attachment.Process(inputOf(b, "image/png"), attachment.Limits{})
		require.NoError(t, err)
		require.Equal(t, [2]int{256, 192}, [2]int{res.Thumbnail.Width, res.Thumbnail.Height})
	})
	t.Run("text4k", func(t *testing.T) {
		t.Parallel()
		a, b := attachment.BenchFixtureText4K(), attachment.BenchFixtureText4K()
		require.Equal(t, a, b, "deterministic")
		require.Len(t, b, 4096)
		require.True(t, utf8.Valid(b))
		require.Equal(t, byte('\n'), b[len(b)-1])
		require.Less(t, utf8.RuneCount(b), len(b), "has multi-byte characters")
		res, err := attachment.Process(inputOf(b, "text/plain"), attachment.Limits{})
		require.NoError(t, err)
		require.Equal(t, attachment.TypeText, res.DetectedType)
		require.Equal(t, bytes.Count(b, []byte("\n")), res.Text.Lines)
		require.Equal(t, len(bytes.Fields(b)), res.Text.Words)
	})
}
