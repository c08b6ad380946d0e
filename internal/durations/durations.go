// Package durations writes Go durations the way Quill's API answers them
// (GET /v1/limits) and the client quotes them back: without the zero
// minutes and seconds time.Duration.String appends. It has no
// dependencies, so the client can share it with the server.
package durations

import (
	"strings"
	"time"
)

// Format writes d without the zero minutes and seconds that
// time.Duration.String appends: 720h, 90m → 1h30m, 1h0m30s, 1.5s.
// time.ParseDuration reads the result back to d.
func Format(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}
