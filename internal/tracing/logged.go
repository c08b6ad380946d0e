package tracing

import (
	"context"

	"github.com/rs/zerolog"
)

// Start is New for a daemon that logs to log: a failure to export spans is
// a warning line (error_category trace_export_failed), and tracing that is
// on says so, naming where spans go. Stop it with Stop.
func Start(ctx context.Context, getenv func(string) string, p Process, log zerolog.Logger) (*Provider, error) {
	p.OnError = func(err error) {
		log.Warn().Err(err).Str("error_category", "trace_export_failed").Msg("spans could not be exported; they are dropped")
	}
	tp, err := New(ctx, getenv, p)
	if err != nil {
		return tp, err
	}
	if exp := tp.Exporter(); exp != "" {
		log.Info().Str("exporter", exp).Str("service", p.Service).Msg("tracing on")
	}
	return tp, nil
}

// Stop is Close at a daemon's exit, once its servers and loops stopped:
// the spans not exported yet are sent, and a failure is a warning line.
func (p *Provider) Stop(log zerolog.Logger) {
	if err := p.Close(); err != nil {
		log.Warn().Err(err).Str("error_category", "trace_export_failed").Msg("the last spans could not be exported")
	}
}
