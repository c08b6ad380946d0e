package db

import "time"

// SessionStartOf exposes, to the external tests, the time a pipeline's
// recheck compares with backend_start.
func SessionStartOf(p *Pipeline) time.Time { return p.since }
