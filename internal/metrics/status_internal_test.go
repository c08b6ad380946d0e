package metrics

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStatusLabel(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]string{100: "100", 201: "201", 404: "404", 599: "599", 600: "600", 99: "99", 0: "0", 1000: "1000"} {
		require.Equal(t, want, statusLabel(code))
	}
}
