package outbox

import "time"

// AppendTime appends t in TimeFormat, byte for byte what
// t.UTC().AppendFormat(dst, TimeFormat) appends (TestAppendTime,
// FuzzAppendTime), without interpreting the layout on every call: a
// create formats its note's time for the answer and its event's for the
// envelope, and AppendFormat's walk of the layout was half a per cent of
// its CPU each time (issue 29). Years outside 0–9999, which the layout
// writes otherwise, take AppendFormat itself.
func AppendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(dst, TimeFormat)
	}
	hour, minute, sec := t.Clock()
	var b [len(TimeFormat)]byte
	put(b[0:4], year)
	b[4] = '-'
	put(b[5:7], int(month))
	b[7] = '-'
	put(b[8:10], day)
	b[10] = 'T'
	put(b[11:13], hour)
	b[13] = ':'
	put(b[14:16], minute)
	b[16] = ':'
	put(b[17:19], sec)
	b[19] = '.'
	put(b[20:26], t.Nanosecond()/1000) // truncated, as the layout's .000000
	b[26] = 'Z'
	return append(dst, b[:]...)
}

// put writes n in decimal into b, zero-padded to b's length.
func put(b []byte, n int) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
}
