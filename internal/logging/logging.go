// Package logging builds the zerolog JSON logger every Quill process writes
// to stderr. A line logged with the context of a span (Event.Ctx) carries
// that span's trace_id and span_id.
package logging

import (
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
)

// New returns a JSON logger at level (trace, debug, info, warn, error)
// writing to w, stamped with the process name. It returns an error naming the
// level when it is unknown.
func New(w io.Writer, level, process string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("invalid QUILL_LOG_LEVEL %q: use trace, debug, info, warn or error", level)
	}
	return zerolog.New(w).Level(lvl).Hook(traceHook{}).With().Timestamp().Str("process", process).Logger(), nil
}

// traceHook adds trace_id and span_id to a line whose event was given a
// context holding a valid span context (Event.Ctx): a traced request's
// lines can be found from its trace, and its trace from them.
type traceHook struct{}

func (traceHook) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	sc := trace.SpanContextFromContext(e.GetCtx())
	if !sc.IsValid() {
		return
	}
	e.Str("trace_id", sc.TraceID().String()).Str("span_id", sc.SpanID().String())
}

func init() {
	// zerolog's field names and time format are package settings; these
	// are constants for every Quill process, set once.
	zerolog.TimeFieldFormat = time.RFC3339Nano
	zerolog.DurationFieldUnit = time.Millisecond
}
