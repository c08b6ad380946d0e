// Package config reads a process's settings from flags and environment
// variables — a flag wins over its variable, the variable over the default —
// and reports a bad value as an error naming where it came from.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/quillhq/quill/internal/buildinfo"
)

// ErrVersion is returned by Parse after printing the version for --version.
// It wraps flag.ErrHelp, so a command stops as it does for --help and exits 0.
var ErrVersion = fmt.Errorf("version printed: %w", flag.ErrHelp)

// Set is the settings of one command.
type Set struct {
	fs       *flag.FlagSet
	getenv   func(string) string
	settings []*setting
	out      io.Writer
	synopsis string
	version  *bool
	removed  []Removed
}

// Removed is a setting that no longer exists: its environment variable
// and the value now fixed in its place.
type Removed struct {
	Env, Fixed string
}

type setting struct {
	flag, env, def, usage string
	raw                   *string
	parse                 func(string) error
	// show is how a bad value is quoted in Parse's error (nil: as given).
	show func(string) string
}

// New returns a set for the command name ("api serve": its first word names
// the program) with only --version; usage, help and the version go to out.
func New(name, synopsis string, getenv func(string) string, out io.Writer) *Set {
	s := &Set{fs: flag.NewFlagSet(name, flag.ContinueOnError), getenv: getenv, out: out, synopsis: synopsis}
	s.fs.SetOutput(out)
	s.fs.Usage = s.usage
	s.version = s.fs.Bool("version", false, "print the program's version and exit")
	return s
}

func (s *Set) usage() {
	fmt.Fprintf(s.out, "%s\n\nSettings (a flag wins over its environment variable):\n", s.synopsis)
	for _, st := range s.settings {
		env := ""
		if st.env != "" {
			env = st.env + ", "
		}
		fmt.Fprintf(s.out, "  --%s\n        %s (%sdefault %q)\n", st.flag, st.usage, env, st.def)
	}
	s.fs.VisitAll(func(f *flag.Flag) {
		for _, st := range s.settings {
			if st.flag == f.Name {
				return
			}
		}
		fmt.Fprintf(s.out, "  --%s\n        %s\n", f.Name, f.Usage)
	})
}

// FlagSet exposes the underlying flags, for flags without a variable.
func (s *Set) FlagSet() *flag.FlagSet { return s.fs }

func (s *Set) add(name, env, def, usage string, parse func(string) error) *setting {
	st := &setting{flag: name, env: env, def: def, usage: usage, parse: parse}
	st.raw = s.fs.String(name, "", usage)
	s.settings = append(s.settings, st)
	return st
}

// String defines a string setting.
func (s *Set) String(p *string, name, env, def, usage string) {
	s.add(name, env, def, usage, func(v string) error { *p = v; return nil })
}

// Duration defines a Go-duration setting that must be greater than zero:
// for the settings whose zero value would otherwise stand for "unset" and
// silently become the default.
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	s.duration(p, name, env, def, usage, false)
}

// DurationOrZero defines a Go-duration setting that may be zero, for the
// settings where zero means something (no wait, no cache); it must not be
// negative.
func (s *Set) DurationOrZero(p *time.Duration, name, env string, def time.Duration, usage string) {
	s.duration(p, name, env, def, usage, true)
}

func (s *Set) duration(p *time.Duration, name, env string, def time.Duration, usage string, zero bool) {
	s.add(name, env, def.String(), usage, func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("not a Go duration such as 30s or 72h")
		}
		switch {
		case d < 0:
			return errors.New("must not be negative")
		case d == 0 && !zero:
			return errors.New("must be greater than 0")
		}
		*p = d
		return nil
	})
}

// Int defines an integer setting of at least min.
func (s *Set) Int(p *int, name, env string, def, minimum int, usage string) {
	s.add(name, env, strconv.Itoa(def), usage, func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("not an integer")
		}
		if n < minimum {
			return fmt.Errorf("must be at least %d", minimum)
		}
		*p = n
		return nil
	})
}

// Bool defines a setting that is true or false (as strconv.ParseBool
// reads it: 1, t, true, 0, f, false, in any case).
func (s *Set) Bool(p *bool, name, env string, def bool, usage string) {
	s.add(name, env, strconv.FormatBool(def), usage, func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("not true or false")
		}
		*p = b
		return nil
	})
}

// Func defines a string setting whose value parse checks and stores; an
// error it returns is reported naming the flag or variable. parse also
// sees the default, and "" when the default is "" and nothing is set.
func (s *Set) Func(name, env, def, usage string, parse func(string) error) {
	s.add(name, env, def, usage, parse)
}

// FuncRedacted is Func for a setting whose value may hold a secret (a URL
// with a password): a bad value is quoted in Parse's error as redact
// returns it, never as given. parse's own error must not quote it either.
func (s *Set) FuncRedacted(name, env, def, usage string, redact func(string) string, parse func(string) error) {
	s.add(name, env, def, usage, parse).show = redact
}

// OptionalInt defines an integer setting that may be left unset (then *p
// stays 0), and when set must be minimum to maximum: for the settings whose
// absence means something else than any value (keep what is there).
func (s *Set) OptionalInt(p *int, name, env string, minimum, maximum int, usage string) {
	s.add(name, env, "", usage, func(v string) error {
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("not an integer")
		}
		if n < minimum || n > maximum {
			return fmt.Errorf("must be %d to %d", minimum, maximum)
		}
		*p = n
		return nil
	})
}

// Parse reads args and the environment. It returns flag.ErrHelp after
// printing the usage for -h/--help, ErrVersion after printing the version for
// --version (a bad environment stops neither), and otherwise an error naming
// the flag or variable whose value is bad.
func (s *Set) Parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		return err
	}
	if *s.version {
		prog, _, _ := strings.Cut(s.fs.Name(), " ")
		fmt.Fprintln(s.out, buildinfo.Read().Line(prog))
		return ErrVersion
	}
	set := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, st := range s.settings {
		v, from := st.def, "default of --"+st.flag
		switch {
		case set[st.flag]:
			v, from = *st.raw, "--"+st.flag
		case st.env != "" && s.getenv(st.env) != "":
			v, from = s.getenv(st.env), st.env
		}
		if err := st.parse(strings.TrimSpace(v)); err != nil {
			if st.show != nil {
				v = st.show(v)
			}
			return fmt.Errorf("invalid %s %q: %w", from, v, err)
		}
	}
	return nil
}

// Remove records settings that no longer exist, for StillSet. Their flags
// are gone: a flag is refused as any unknown flag is.
func (s *Set) Remove(r ...Removed) { s.removed = append(s.removed, r...) }

// StillSet returns the removed settings (Remove) the environment still
// sets, so that the process can say it ignores them rather than ignore
// them silently.
func (s *Set) StillSet() []Removed {
	var set []Removed
	for _, r := range s.removed {
		if s.getenv(r.Env) != "" {
			set = append(set, r)
		}
	}
	return set
}

// Args returns the arguments left after the flags.
func (s *Set) Args() []string { return s.fs.Args() }
