package idempotency

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// rawBool reads a boolean in either wire format and refuses anything else,
// so that scanClaim falls back to pgx's scan rather than guess.
func TestRawBool(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw    []byte
		format int16
		v, ok  bool
	}{
		{[]byte{1}, pgx.BinaryFormatCode, true, true},
		{[]byte{0}, pgx.BinaryFormatCode, false, true},
		{[]byte{2}, pgx.BinaryFormatCode, false, false},
		{[]byte("t"), pgx.TextFormatCode, true, true},
		{[]byte("f"), pgx.TextFormatCode, false, true},
		{[]byte("t"), pgx.BinaryFormatCode, false, false},
		{[]byte{1}, pgx.TextFormatCode, false, false},
		{nil, pgx.BinaryFormatCode, false, false},
		{[]byte("true"), pgx.TextFormatCode, false, false},
	} {
		v, ok := rawBool(c.raw, c.format)
		require.Equal(t, c.v, v, "%q format %d", c.raw, c.format)
		require.Equal(t, c.ok, ok, "%q format %d", c.raw, c.format)
	}
}
