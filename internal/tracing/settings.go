package tracing

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Exporters Quill implements (OTEL_TRACES_EXPORTER).
const (
	exporterOTLP    = "otlp"
	exporterConsole = "console"
	exporterNone    = "none"
)

// Defaults of the OTLP exporter, as the OpenTelemetry specification sets
// them.
const (
	defaultEndpoint = "http://localhost:4318"
	tracesPath      = "/v1/traces"
	defaultTimeout  = 10 * time.Second
)

// settings are what the OTEL_* environment asks of tracing.
type settings struct {
	// exporter is exporterOTLP or exporterConsole; "" is off.
	exporter string
	// endpoint is the URL the OTLP exporter posts spans to.
	endpoint string
	headers  map[string]string
	timeout  time.Duration
	gzip     bool
	sampler  sdktrace.Sampler
	service  string
	resource []attribute.KeyValue
}

// readSettings reads the standard variables Quill implements:
//
//   - OTEL_SDK_DISABLED=true turns tracing off whatever else is set.
//   - OTEL_TRACES_EXPORTER: otlp, console or none. Unset, tracing is on
//     (otlp) only when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
//     OTEL_EXPORTER_OTLP_ENDPOINT is set: unlike the specification's
//     default of otlp, an unconfigured Quill sends nothing anywhere.
//   - OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS, _TIMEOUT (ms),
//     _COMPRESSION (gzip, none), _PROTOCOL (http/protobuf only), the
//     signal-specific one first.
//   - OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default
//     parentbased_always_on).
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
//
// service is the service name when neither names one. An invalid value is
// an error naming its variable.
func readSettings(getenv func(string) string, service string) (settings, error) {
	env := func(name string) string { return strings.TrimSpace(getenv(name)) }
	// signal returns the traces-specific variable's value, else the
	// generic one's, and the name of the one read.
	signal := func(suffix string) (string, string) {
		name := "OTEL_EXPORTER_OTLP_TRACES_" + suffix
		if v := env(name); v != "" {
			return v, name
		}
		name = "OTEL_EXPORTER_OTLP_" + suffix
		return env(name), name
	}
	var s settings
	if disabled := env("OTEL_SDK_DISABLED"); strings.EqualFold(disabled, "true") {
		return s, nil
	}
	s.exporter = strings.ToLower(env("OTEL_TRACES_EXPORTER"))
	tracesEndpoint, endpoint := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), env("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch s.exporter {
	case "":
		if tracesEndpoint == "" && endpoint == "" {
			return settings{}, nil
		}
		s.exporter = exporterOTLP
	case exporterNone:
		return settings{}, nil
	case exporterOTLP, exporterConsole:
	default:
		return settings{}, fmt.Errorf("OTEL_TRACES_EXPORTER %q: use otlp, console or none (one exporter): %w", s.exporter, errUnsupported)
	}

	var err error
	if s.exporter == exporterOTLP {
		if s.endpoint, err = otlpEndpoint(tracesEndpoint, endpoint); err != nil {
			return settings{}, err
		}
		if v, name := signal("PROTOCOL"); v != "" && v != "http/protobuf" {
			return settings{}, fmt.Errorf("%s %q: Quill exports OTLP over HTTP only, use http/protobuf: %w", name, v, errUnsupported)
		}
		if v, name := signal("HEADERS"); v != "" {
			if s.headers, err = keyValues(v); err != nil {
				return settings{}, fmt.Errorf("%s: %w", name, err)
			}
		}
		s.timeout = defaultTimeout
		if v, name := signal("TIMEOUT"); v != "" {
			ms, err := strconv.Atoi(v)
			if err != nil || ms <= 0 {
				return settings{}, fmt.Errorf("%s %q: want a positive number of milliseconds", name, v)
			}
			s.timeout = time.Duration(ms) * time.Millisecond
		}
		switch v, name := signal("COMPRESSION"); v {
		case "", "none":
		case "gzip":
			s.gzip = true
		default:
			return settings{}, fmt.Errorf("%s %q: use gzip or none: %w", name, v, errUnsupported)
		}
	}
	if s.sampler, err = sampler(env("OTEL_TRACES_SAMPLER"), env("OTEL_TRACES_SAMPLER_ARG")); err != nil {
		return settings{}, err
	}
	s.service = service
	if v := env("OTEL_RESOURCE_ATTRIBUTES"); v != "" {
		attrs, err := keyValues(v)
		if err != nil {
			return settings{}, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
		}
		for k, v := range attrs {
			if k == "service.name" {
				s.service = v
				continue
			}
			s.resource = append(s.resource, attribute.String(k, v))
		}
	}
	if v := env("OTEL_SERVICE_NAME"); v != "" {
		s.service = v
	}
	return s, nil
}

// otlpEndpoint is the URL spans are posted to: the traces endpoint as it
// is, else the base endpoint with /v1/traces appended, else the default.
func otlpEndpoint(traces, base string) (string, error) {
	name, u := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces
	if u == "" {
		name, u = "OTEL_EXPORTER_OTLP_ENDPOINT", base
		if u == "" {
			u = defaultEndpoint
		}
		u = strings.TrimSuffix(u, "/") + tracesPath
	}
	parsed, err := url.Parse(u)
	if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
		return "", fmt.Errorf("%s %q: want an http:// or https:// URL", name, u)
	}
	return u, nil
}

// keyValues parses the W3C-Baggage-like list of OTEL_RESOURCE_ATTRIBUTES
// and OTEL_EXPORTER_OTLP_HEADERS: key=value pairs separated by commas,
// values percent-encoded.
func keyValues(s string) (map[string]string, error) {
	m := map[string]string{}
	for item := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", strings.TrimSpace(item))
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("the value of %s: %w", k, err)
		}
		m[k] = val
	}
	return m, nil
}

// sampler is the sampler OTEL_TRACES_SAMPLER names, with arg
// (OTEL_TRACES_SAMPLER_ARG) the ratio of the ratio-based ones (default 1).
func sampler(name, arg string) (sdktrace.Sampler, error) {
	ratio := 1.0
	if arg != "" && strings.HasSuffix(name, "traceidratio") {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG %q: want a ratio from 0 to 1", arg)
		}
		ratio = r
	}
	switch strings.ToLower(name) {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER %q: use always_on, always_off, traceidratio or their parentbased_ forms: %w", name, errUnsupported)
}
