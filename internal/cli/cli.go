// Package cli holds what every Quill command shares at its edge: the two
// error kinds that decide the exit status, main's wiring of signals to
// run(ctx, args, getenv, stdout, stderr), subcommand dispatch and the
// output of listings.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-json-experiment/json"

	"github.com/quillhq/quill/internal/buildinfo"
	"github.com/quillhq/quill/internal/config"
)

// UsageError is a mistake in the command line or the settings, caught
// before anything was done: exit status 2.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// LoggedError has been written to the log already: exit status 1 without
// printing it again, so a failure is one line.
type LoggedError struct{ Err error }

func (e LoggedError) Error() string { return e.Err.Error() }

func (e LoggedError) Unwrap() error { return e.Err }

// ExitCode returns the exit status for run's error and prints the error,
// prefixed with the program's name, unless it was logged: 0 for nil, --help
// and --version, 2 for a UsageError, 1 otherwise.
func ExitCode(prog string, err error, stderr io.Writer) int {
	var (
		uerr   UsageError
		logged LoggedError
	)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &logged):
		return 1
	case errors.As(err, &uerr):
		fmt.Fprintln(stderr, prog+":", err)
		return 2
	default:
		fmt.Fprintln(stderr, prog+":", err)
		return 1
	}
}

// RunFunc is a command's whole program.
type RunFunc func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// Main runs run with the process's arguments, environment and streams,
// cancelling its context on SIGINT or SIGTERM, and exits with ExitCode.
func Main(prog string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(ExitCode(prog, err, os.Stderr))
}

// Parse reads a command's settings; a bad flag or value becomes a
// UsageError, --help stays flag.ErrHelp and --version config.ErrVersion
// (which wraps flag.ErrHelp).
func Parse(s *config.Set, args []string) error {
	err := s.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return UsageError{Msg: err.Error()}
}

// ParseFlags is Parse for a tool's standard flag set, which takes no
// positional arguments: a bad flag or an argument left over becomes a
// UsageError, --help stays flag.ErrHelp.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return UsageError{Msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return UsageError{Msg: fmt.Sprintf("unexpected arguments %q", fs.Args())}
	}
	return nil
}

// Dispatch runs the subcommand named by args[0] (def when args is empty or
// starts with a flag), answers -h/--help/help with overview and
// --version/version with the program's version line (prog's first word names
// the program), and refuses an unknown command with a UsageError.
func Dispatch(ctx context.Context, prog, overview, def string, cmds map[string]RunFunc,
	args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := def
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help"):
		fmt.Fprintln(stdout, overview)
		return nil
	case AsksVersion(args) || (len(args) > 0 && args[0] == "version" && cmds["version"] == nil):
		PrintVersion(prog, stdout)
		return nil
	case len(args) > 0 && !strings.HasPrefix(args[0], "-"):
		cmd, args = args[0], args[1:]
	}
	run, ok := cmds[cmd]
	if !ok {
		return UsageError{Msg: fmt.Sprintf("unknown command %q; run \"%s --help\" for the commands", cmd, prog)}
	}
	return run(ctx, args, getenv, stdout, stderr)
}

// AsksVersion reports whether args start with --version (or -version), for
// a program that parses its own flags.
func AsksVersion(args []string) bool {
	return len(args) > 0 && (args[0] == "--version" || args[0] == "-version")
}

// PrintVersion writes the version line of prog (its first word names the
// program) to w.
func PrintVersion(prog string, w io.Writer) {
	name, _, _ := strings.Cut(prog, " ")
	fmt.Fprintln(w, buildinfo.Read().Line(name))
}

// Subcommand splits the arguments of a command group (relay events,
// attachment-worker dead-letters) into the subcommand and its arguments.
// With no arguments it returns a UsageError with usage; for -h, -help,
// --help or help it prints usage to stdout, and for --version or -version
// the version line of prog (as Dispatch does), and returns ok false and a
// nil error. The caller refuses a subcommand it does not know.
func Subcommand(prog string, args []string, usage string, stdout io.Writer) (sub string, rest []string, ok bool, err error) {
	if len(args) == 0 {
		return "", nil, false, UsageError{Msg: usage}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return "", nil, false, nil
	case "--version", "-version":
		PrintVersion(prog, stdout)
		return "", nil, false, nil
	}
	return args[0], args[1:], true, nil
}

// PrintList writes items to w: with asJSON one JSON object a line (nothing
// for no items), otherwise line(item) a line, or none when there are no
// items. It returns the first error of encoding an item.
func PrintList[T any](w io.Writer, items []T, asJSON bool, none string, line func(T) string) error {
	for _, it := range items {
		if !asJSON {
			fmt.Fprintln(w, line(it))
			continue
		}
		b, err := json.Marshal(it)
		if err != nil {
			return err
		}
		fmt.Fprintln(w, string(b))
	}
	if len(items) == 0 && !asJSON {
		fmt.Fprintln(w, none)
	}
	return nil
}

// EnvOr returns a lookup of getenv that gives def for an unset or empty
// variable: the default of a tool's flag that its environment may set.
func EnvOr(getenv func(string) string) func(name, def string) string {
	return func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
}
