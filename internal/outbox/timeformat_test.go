package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/outbox"
)

func TestAppendTime(t *testing.T) {
	t.Parallel()
	berlin := time.FixedZone("CET", 3600)
	for _, tc := range []struct {
		name string
		t    time.Time
		want string
	}{
		{"a create's", time.Date(2026, 12, 3, 14, 5, 9, 123456789, time.UTC), "2026-12-03T14:05:09.123456Z"},
		{"truncated, not rounded", time.Date(2026, 1, 1, 0, 0, 0, 999999999, time.UTC), "2026-01-01T00:00:00.999999Z"},
		{"no fraction", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), "2026-01-01T00:00:00.000000Z"},
		{"another zone, made UTC", time.Date(2026, 1, 1, 0, 30, 0, 0, berlin), "2025-12-31T23:30:00.000000Z"},
		{"year one", time.Date(1, 2, 3, 4, 5, 6, 7000, time.UTC), "0001-02-03T04:05:06.000007Z"},
		{"the last four-digit year", time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), "9999-12-31T23:59:59.999999Z"},
		{"zero time", time.Time{}, "0001-01-01T00:00:00.000000Z"},
		{"a five-digit year", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), "10000-01-01T00:00:00.000000Z"},
		{"a negative year", time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), "-0001-01-01T00:00:00.000000Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, string(outbox.AppendTime(nil, tc.t)))
			require.Equal(t, tc.t.UTC().Format(outbox.TimeFormat), string(outbox.AppendTime([]byte("x"), tc.t))[1:])
		})
	}
}

// FuzzAppendTime holds AppendTime to the layout it stands for, over the
// whole range of times.
func FuzzAppendTime(f *testing.F) {
	for _, s := range []int64{0, 1, -1, 1796306709123456789, 253402300799, 253402300800, -62135596800, -62135596801} {
		f.Add(s, int64(0), int32(0))
	}
	f.Fuzz(func(t *testing.T, sec, nsec int64, offset int32) {
		tm := time.Unix(sec, nsec).In(time.FixedZone("", int(offset%(24*3600))))
		require.Equal(t, tm.UTC().AppendFormat(nil, outbox.TimeFormat), outbox.AppendTime(nil, tm), "%v", tm)
	})
}
