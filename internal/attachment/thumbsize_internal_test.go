package attachment

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestThumbSize(t *testing.T) {
	t.Parallel()
	tests := []struct{ w, h, wantW, wantH int }{
		{1000, 500, 256, 128},
		{500, 1000, 128, 256},
		{100, 300, 85, 256}, // 85.33 rounds down
		{300, 100, 256, 85},
		{10, 10, 10, 10},
		{256, 1, 256, 1},
		{256, 256, 256, 256},
		{257, 257, 256, 256},
		{512, 3, 256, 2},     // 1.5 rounds half up
		{1024, 3, 256, 1},    // 0.75 rounds up
		{3000, 2, 256, 1},    // 0.17 would round to 0: at least 1
		{640, 427, 256, 171}, // 170.8
		{65535, 65535, 256, 256},
		{1<<31 - 1, 1, 256, 1},
	}
	for _, tc := range tests {
		w, h := thumbSize(tc.w, tc.h, ThumbnailMaxSide)
		require.Equal(t, [2]int{tc.wantW, tc.wantH}, [2]int{w, h}, "%dx%d", tc.w, tc.h)
	}
}
