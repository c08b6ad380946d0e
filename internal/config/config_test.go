package config_test

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
	"github.com/quillhq/quill/internal/config"
)

type values struct {
	addr  string
	wait  time.Duration
	ttl   time.Duration // may be zero
	body  int
	label string // a setting without an environment variable
}

const (
	defAddr = ":8080"
	defWait = 2 * time.Second
	defBody = 2097152
	defLbl  = "none"
	defTTL  = time.Minute
)

func newSet(env map[string]string, out *bytes.Buffer) (*config.Set, *values) {
	v := &values{}
	s := config.New("api serve", "usage: api serve [flags]", func(k string) string { return env[k] }, out)
	s.String(&v.addr, "http-addr", "QUILL_HTTP_ADDR", defAddr, "API listen address")
	s.Duration(&v.wait, "idempotency-wait", "QUILL_IDEMPOTENCY_WAIT", defWait, "wait for a concurrent request")
	s.Int(&v.body, "max-body-bytes", "QUILL_MAX_BODY_BYTES", defBody, 1, "request body limit")
	s.String(&v.label, "label", "", defLbl, "a flag-only setting")
	s.DurationOrZero(&v.ttl, "token-cache-ttl", "QUILL_TOKEN_CACHE_TTL", defTTL, "0 disables")
	return s, v
}

func TestParsePrecedence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want values
		rest []string
	}{
		{
			name: "defaults",
			want: values{addr: defAddr, wait: defWait, body: defBody, label: defLbl, ttl: defTTL},
		},
		{
			name: "env beats default",
			env:  map[string]string{"QUILL_HTTP_ADDR": ":1", "QUILL_IDEMPOTENCY_WAIT": "500ms", "QUILL_MAX_BODY_BYTES": "10"},
			want: values{addr: ":1", wait: 500 * time.Millisecond, body: 10, label: defLbl, ttl: defTTL},
		},
		{
			name: "flag beats env",
			args: []string{"--http-addr=:2", "--idempotency-wait", "3s", "-max-body-bytes=20", "--label", "x"},
			env:  map[string]string{"QUILL_HTTP_ADDR": ":1", "QUILL_IDEMPOTENCY_WAIT": "500ms", "QUILL_MAX_BODY_BYTES": "10"},
			want: values{addr: ":2", wait: 3 * time.Second, body: 20, label: "x", ttl: defTTL},
		},
		{
			name: "flag beats default",
			args: []string{"--idempotency-wait=1m"},
			want: values{addr: defAddr, wait: time.Minute, body: defBody, label: defLbl, ttl: defTTL},
		},
		{
			name: "each setting from its own source",
			args: []string{"--http-addr=:3"},
			env:  map[string]string{"QUILL_IDEMPOTENCY_WAIT": "4s"},
			want: values{addr: ":3", wait: 4 * time.Second, body: defBody, label: defLbl, ttl: defTTL},
		},
		{
			name: "empty env is unset",
			env:  map[string]string{"QUILL_HTTP_ADDR": "", "QUILL_IDEMPOTENCY_WAIT": ""},
			want: values{addr: defAddr, wait: defWait, body: defBody, label: defLbl, ttl: defTTL},
		},
		{
			name: "flag beats a bad env value",
			args: []string{"--idempotency-wait=1s", "--max-body-bytes=5"},
			env:  map[string]string{"QUILL_IDEMPOTENCY_WAIT": "soon", "QUILL_MAX_BODY_BYTES": "lots"},
			want: values{addr: defAddr, wait: time.Second, body: 5, label: defLbl, ttl: defTTL},
		},
		{
			name: "zero where zero means something",
			env:  map[string]string{"QUILL_TOKEN_CACHE_TTL": "0s"},
			want: values{addr: defAddr, wait: defWait, body: defBody, label: defLbl, ttl: 0},
		},
		{
			name: "int at its minimum",
			env:  map[string]string{"QUILL_MAX_BODY_BYTES": "1"},
			want: values{addr: defAddr, wait: defWait, body: 1, label: defLbl, ttl: defTTL},
		},
		{
			name: "arguments after the flags",
			args: []string{"--http-addr=:4", "token", "create"},
			want: values{addr: ":4", wait: defWait, body: defBody, label: defLbl, ttl: defTTL},
			rest: []string{"token", "create"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			s, got := newSet(tt.env, &out)
			require.NoError(t, s.Parse(tt.args))
			require.Equal(t, tt.want, *got)
			if tt.rest == nil {
				require.Empty(t, s.Args())
			} else {
				require.Equal(t, tt.rest, s.Args())
			}
		})
	}
}

func TestParseBadValueNamesItsSource(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    []string // substrings of the error
		notWant []string
	}{
		{
			name: "bad duration in env",
			env:  map[string]string{"QUILL_IDEMPOTENCY_WAIT": "2 seconds"},
			want: []string{"QUILL_IDEMPOTENCY_WAIT", "2 seconds"}, notWant: []string{"--idempotency-wait"},
		},
		{
			name: "bad duration flag",
			args: []string{"--idempotency-wait=2 seconds"},
			want: []string{"--idempotency-wait", "2 seconds"}, notWant: []string{"QUILL_IDEMPOTENCY_WAIT"},
		},
		{
			name: "bare number is not a duration",
			env:  map[string]string{"QUILL_IDEMPOTENCY_WAIT": "5"},
			want: []string{"QUILL_IDEMPOTENCY_WAIT"},
		},
		{
			name: "negative duration",
			args: []string{"--idempotency-wait=-1s"},
			want: []string{"--idempotency-wait", "-1s"},
		},
		{
			name: "zero duration",
			env:  map[string]string{"QUILL_IDEMPOTENCY_WAIT": "0s"},
			want: []string{"QUILL_IDEMPOTENCY_WAIT", "0s", "greater than 0"},
		},
		{
			name: "negative duration that may be zero",
			env:  map[string]string{"QUILL_TOKEN_CACHE_TTL": "-1m"},
			want: []string{"QUILL_TOKEN_CACHE_TTL", "must not be negative"},
		},
		{
			name: "bad int in env",
			env:  map[string]string{"QUILL_MAX_BODY_BYTES": "2MB"},
			want: []string{"QUILL_MAX_BODY_BYTES", "2MB"}, notWant: []string{"--max-body-bytes"},
		},
		{
			name: "bad int flag",
			args: []string{"--max-body-bytes", "1.5"},
			want: []string{"--max-body-bytes", "1.5"}, notWant: []string{"QUILL_MAX_BODY_BYTES"},
		},
		{
			name: "int below minimum",
			env:  map[string]string{"QUILL_MAX_BODY_BYTES": "0"},
			want: []string{"QUILL_MAX_BODY_BYTES", "at least 1"},
		},
		{
			name: "empty flag value",
			args: []string{"--max-body-bytes="},
			want: []string{"--max-body-bytes"},
		},
		{
			name: "unknown flag",
			args: []string{"--no-such-flag"},
			want: []string{"no-such-flag"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			s, _ := newSet(tt.env, &out)
			err := s.Parse(tt.args)
			require.Error(t, err)
			require.False(t, errors.Is(err, flag.ErrHelp))
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
			for _, w := range tt.notWant {
				require.NotContains(t, err.Error(), w)
			}
		})
	}
}

func TestParseHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--help", "-help", "-h", "--h"} {
		t.Run(arg, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			// A bad environment does not stop --help.
			s, _ := newSet(map[string]string{"QUILL_IDEMPOTENCY_WAIT": "bad"}, &out)
			err := s.Parse([]string{arg})
			require.ErrorIs(t, err, flag.ErrHelp)
			help := out.String()
			for _, w := range []string{
				"usage: api serve", "--http-addr", "QUILL_HTTP_ADDR", `":8080"`,
				"--idempotency-wait", "QUILL_IDEMPOTENCY_WAIT", `"2s"`,
				"--max-body-bytes", "QUILL_MAX_BODY_BYTES", "--label",
			} {
				require.Contains(t, help, w)
			}
		})
	}
}

func TestFlagSetExtraFlags(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	s, v := newSet(nil, &out)
	tenant := s.FlagSet().String("tenant", "", "tenant name")
	require.NoError(t, s.Parse([]string{"--tenant", "acme", "--http-addr", ":9"}))
	require.Equal(t, "acme", *tenant)
	require.Equal(t, ":9", v.addr)

	out.Reset()
	s, _ = newSet(nil, &out)
	s.FlagSet().String("tenant", "", "tenant name")
	require.ErrorIs(t, s.Parse([]string{"-h"}), flag.ErrHelp)
	require.Contains(t, out.String(), "--tenant")
}

func TestParseVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--version"}, {"-version"}, {"--version=true"}, {"--http-addr", ":9", "--version"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			// A bad environment does not stop --version.
			s, _ := newSet(map[string]string{"QUILL_IDEMPOTENCY_WAIT": "bad"}, &out)
			err := s.Parse(args)
			require.ErrorIs(t, err, config.ErrVersion)
			require.ErrorIs(t, err, flag.ErrHelp, "a command stops for --version as for --help")
			require.Equal(t, buildinfo.Read().Line("api")+"\n", out.String(), "one line, named by the program (the name's first word)")
		})
	}
	var out bytes.Buffer
	s, _ := newSet(nil, &out)
	require.NoError(t, s.Parse([]string{"--version=false"}))
	require.Empty(t, out.String())
	require.ErrorIs(t, s.Parse([]string{"-h"}), flag.ErrHelp)
	require.Contains(t, out.String(), "--version", "the help lists --version")
}

// An OptionalInt left unset stays 0; when set it must be in range.
func TestOptionalInt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, env string
		args      []string
		want      int
		err       string
	}{
		{name: "unset", want: 0},
		{name: "set", env: "3", want: 3},
		{name: "flag wins", env: "3", args: []string{"--replicas", "5"}, want: 5},
		{name: "zero is out of range", env: "0", err: `invalid QUILL_REPLICAS "0": must be 1 to 5`},
		{name: "too many", args: []string{"--replicas", "6"}, err: `invalid --replicas "6": must be 1 to 5`},
		{name: "not a number", env: "three", err: `invalid QUILL_REPLICAS "three": not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var n int
			s := config.New("relay run", "usage", func(k string) string {
				if k == "QUILL_REPLICAS" {
					return tc.env
				}
				return ""
			}, &bytes.Buffer{})
			s.OptionalInt(&n, "replicas", "QUILL_REPLICAS", 1, 5, "replicas")
			err := s.Parse(tc.args)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, n)
		})
	}
}

func TestBool(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, env string
		def       bool
		args      []string
		want      bool
		err       string
	}{
		{name: "unset takes the default", def: true, want: true},
		{name: "unset false", want: false},
		{name: "true", env: "true", want: true},
		{name: "1", env: "1", want: true},
		{name: "FALSE", env: "FALSE", def: true, want: false},
		{name: "flag wins", env: "false", args: []string{"--pprof", "true"}, want: true},
		{name: "not a bool", env: "yes", err: `invalid QUILL_PPROF "yes": not true or false`},
		{name: "empty flag", args: []string{"--pprof", ""}, err: `invalid --pprof "": not true or false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bool
			s := config.New("api serve", "usage", func(k string) string {
				if k == "QUILL_PPROF" {
					return tc.env
				}
				return ""
			}, &bytes.Buffer{})
			s.Bool(&b, "pprof", "QUILL_PPROF", tc.def, "profiles")
			err := s.Parse(tc.args)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, b)
		})
	}
}

// StillSet names the removed settings the environment still sets, and only
// those.
func TestStillSet(t *testing.T) {
	t.Parallel()
	gone, unset := config.Removed{Env: "QUILL_GONE", Fixed: "42"}, config.Removed{Env: "QUILL_UNSET", Fixed: "1"}
	for _, tc := range []struct {
		env  map[string]string
		want []config.Removed
	}{
		{env: map[string]string{}, want: nil},
		{env: map[string]string{"QUILL_GONE": "7"}, want: []config.Removed{gone}},
	} {
		s := config.New("x", "usage", func(k string) string { return tc.env[k] }, io.Discard)
		s.Remove(gone, unset)
		require.NoError(t, s.Parse(nil))
		require.Equal(t, tc.want, s.StillSet())
	}
}
