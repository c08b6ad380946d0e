package cli_test

import (
	"bytes"
	"context"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
)

// program is a two-level command as the daemons and quill are built: a
// default subcommand whose settings go through cli.Parse, and a nested
// Dispatch.
func program(ran *string) cli.RunFunc {
	serve := func(_ context.Context, args []string, getenv func(string) string, stdout, _ io.Writer) error {
		var (
			addr string
			wait time.Duration
		)
		s := config.New("prog serve", "usage: prog serve", getenv, stdout)
		s.String(&addr, "addr", "PROG_ADDR", ":1", "listen address")
		s.Duration(&wait, "wait", "PROG_WAIT", time.Second, "wait")
		if err := cli.Parse(s, args); err != nil {
			return err
		}
		*ran = "serve"
		return nil
	}
	return func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		return cli.Dispatch(ctx, "prog", "prog — overview", "serve", map[string]cli.RunFunc{
			"serve": serve,
			"events": func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
				return cli.Dispatch(ctx, "prog events", "prog events — overview", "", map[string]cli.RunFunc{
					"list": serve,
				}, args, getenv, stdout, stderr)
			},
		}, args, getenv, stdout, stderr)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	line := buildinfo.Read().Line("prog") + "\n"
	tests := []struct {
		name string
		args []string
	}{
		{name: "flag", args: []string{"--version"}},
		{name: "single-dash flag", args: []string{"-version"}},
		{name: "subcommand", args: []string{"version"}},
		{name: "flag of the default command", args: []string{"--addr", ":2", "--version"}},
		{name: "flag of a named command", args: []string{"serve", "--version"}},
		{name: "nested dispatch", args: []string{"events", "--version"}},
		{name: "flag of a nested command", args: []string{"events", "list", "--version"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			ran := ""
			// A bad environment does not stop --version.
			getenv := func(k string) string { return map[string]string{"PROG_WAIT": "bad"}[k] }
			err := program(&ran)(t.Context(), tt.args, getenv, &stdout, &stderr)
			require.Equal(t, 0, cli.ExitCode("prog", err, &stderr), "%v", err)
			require.Equal(t, line, stdout.String(), "one line naming the program, whatever the command")
			require.Empty(t, stderr.String())
			require.Empty(t, ran, "nothing runs")
		})
	}
}

func TestBadEnvironmentWithoutVersion(t *testing.T) {
	t.Parallel()
	// The environment TestVersion runs with is refused without --version.
	ran := ""
	err := program(&ran)(t.Context(), []string{"serve"}, func(k string) string {
		return map[string]string{"PROG_WAIT": "bad"}[k]
	}, io.Discard, io.Discard)
	require.Equal(t, 2, cli.ExitCode("prog", err, io.Discard), "%v", err)
	require.Empty(t, ran)
}

func TestVersionCommandOfItsOwn(t *testing.T) {
	t.Parallel()
	var stdout bytes.Buffer
	err := cli.Dispatch(t.Context(), "prog", "", "", map[string]cli.RunFunc{
		"version": func(_ context.Context, _ []string, _ func(string) string, stdout, _ io.Writer) error {
			_, err := io.WriteString(stdout, "its own\n")
			return err
		},
	}, []string{"version"}, func(string) string { return "" }, &stdout, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "its own\n", stdout.String(), "a program's own version command wins")
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		usage string // the UsageError's message; "" for none
		help  bool
	}{
		{args: nil},
		{args: []string{"--n", "3"}},
		{args: []string{"--n", "x"}, usage: `invalid value "x" for flag -n: parse error`},
		{args: []string{"--nope"}, usage: "flag provided but not defined: -nope"},
		{args: []string{"--n", "3", "extra"}, usage: `unexpected arguments ["extra"]`},
		{args: []string{"--help"}, help: true},
	} {
		fs := flag.NewFlagSet("tool", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Int("n", 0, "a number")
		err := cli.ParseFlags(fs, tc.args)
		var uerr cli.UsageError
		switch {
		case tc.help:
			require.ErrorIs(t, err, flag.ErrHelp, "%q", tc.args)
		case tc.usage != "":
			require.ErrorAs(t, err, &uerr, "%q", tc.args)
			require.Equal(t, tc.usage, uerr.Msg)
		default:
			require.NoError(t, err, "%q", tc.args)
		}
	}
}
