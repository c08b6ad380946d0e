// Package logging builds the zerolog JSON logger every Quill process writes
// to stderr.
package logging

import (
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"
)

// New returns a JSON logger at level (trace, debug, info, warn, error)
// writing to w, stamped with the process name. It returns an error naming the
// level when it is unknown.
func New(w io.Writer, level, process string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("invalid QUILL_LOG_LEVEL %q: use trace, debug, info, warn or error", level)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("process", process).Logger(), nil
}

func init() {
	// zerolog's field names and time format are package settings; these
	// are constants for every Quill process, set once.
	zerolog.TimeFieldFormat = time.RFC3339Nano
	zerolog.DurationFieldUnit = time.Millisecond
}
