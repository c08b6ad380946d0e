package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
)

// Defaults of the settings (SPEC §10).
const (
	defaultURL      = "http://127.0.0.1:8080"
	defaultAttempts = 5
	defaultDeadline = 30 * time.Second
)

// Exit statuses (SPEC §10).
const (
	exitOK      = 0
	exitUsage   = 2
	exitRefused = 3
	exitUnknown = 4
	exitFailure = 5
)

// States printed for a write (SPEC §10).
const (
	stateCompleted = "completed"
	stateRefused   = "refused"
	stateUnknown   = "unknown"
)

const overview = `quill — Quill's agent-side command line: writes that survive retries and restarts.

Usage:
  quill notes create --title T [--body B] [--attach FILE] [--content-type CT] [--key K]
  quill notes update ID --if-version N [--title T] [--body B] [--key K]
  quill notes delete ID [--if-version N] [--key K]
  quill notes get ID
  quill notes list [--limit N] [--cursor C]
  quill webhooks create URL --event-type TYPE [--event-type TYPE…] [--description D] [--key K]
  quill webhooks list
  quill webhooks get ID
  quill webhooks delete ID [--key K]
  quill webhooks rotate-secret ID [--key K]
  quill ops get KEY
  quill ops resume
  quill ops prune [--older-than D] [--key-retention D] [--abandon]
  quill mcp [--http ADDR]
  quill events tail --tenant T [--type TYPE] [--from-seq N | --since T] [--count N] [--json]
  quill version

Every command takes --url (QUILL_URL), --token-file (QUILL_TOKEN_FILE) or
--token (QUILL_TOKEN; as a flag it shows in the process list), --attempts,
--deadline and --json; writes and "ops resume" also --journal (QUILL_JOURNAL).
"ops prune" works on the journal (--journal, --json); a token is optional:
with one it takes the key retention from the server (GET /v1/limits).
"mcp --http ADDR" serves remote MCP; each caller's Authorization is its token.
"events tail" follows a tenant's events on the stream, not the API: it takes
NATS_URL, QUILL_NATS_*, QUILL_STREAM and QUILL_SUBJECT_PREFIX instead (and
--json: each event's CloudEvent as published); it starts with new events,
or at --from-seq or --since (RFC 3339, or a duration back from now).
Each write is journalled before its first send. "webhooks create" and
"webhooks rotate-secret" print the endpoint's secret once (the journal never
keeps it). Run "quill <command> --help".

Exit status: 0 done; 2 usage; 3 refused (the server's answer is final; for
"--if-version N", 412 precondition_failed: the note is at another version —
read it again with "quill notes get ID" and decide);
4 outcome unknown (the operation key is printed: run "quill ops get KEY" or
"quill ops resume", never the write again with a new key); 5 other failure.`

// exitError carries an exit status for an outcome that has been reported
// already (on stdout or stderr).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// exitCode maps run's error to the exit status, printing it unless it was
// reported.
func exitCode(err error, stderr io.Writer) int {
	var (
		ee exitError
		ue cli.UsageError
	)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "quill:", err)
		return exitUsage
	default:
		fmt.Fprintln(stderr, "quill:", err)
		return exitFailure
	}
}

// run is the whole program.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := &env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	return cli.Dispatch(ctx, "quill", overview, "", map[string]cli.RunFunc{
		"notes": func(ctx context.Context, args []string, _ func(string) string, _, _ io.Writer) error {
			return cli.Dispatch(ctx, "quill notes", overview, "", map[string]cli.RunFunc{
				"create": e.wrap(e.notesCreate),
				"update": e.wrap(e.notesUpdate),
				"delete": e.wrap(e.notesDelete),
				"get":    e.wrap(e.notesGet),
				"list":   e.wrap(e.notesList),
			}, args, getenv, stdout, stderr)
		},
		"webhooks": func(ctx context.Context, args []string, _ func(string) string, _, _ io.Writer) error {
			return cli.Dispatch(ctx, "quill webhooks", overview, "", map[string]cli.RunFunc{
				"create":        e.wrap(e.webhooksCreate),
				"list":          e.wrap(e.webhooksList),
				"get":           e.wrap(e.webhooksGet),
				"delete":        e.wrap(e.webhooksDelete),
				"rotate-secret": e.wrap(e.webhooksRotate),
			}, args, getenv, stdout, stderr)
		},
		"ops": func(ctx context.Context, args []string, _ func(string) string, _, _ io.Writer) error {
			return cli.Dispatch(ctx, "quill ops", overview, "", map[string]cli.RunFunc{
				"get":    e.wrap(e.opsGet),
				"resume": e.wrap(e.opsResume),
				"prune":  e.wrap(e.opsPrune),
			}, args, getenv, stdout, stderr)
		},
		"mcp": e.wrap(e.mcp),
		"events": func(ctx context.Context, args []string, _ func(string) string, _, _ io.Writer) error {
			return cli.Dispatch(ctx, "quill events", overview, "", map[string]cli.RunFunc{
				"tail": e.wrap(e.eventsTail),
			}, args, getenv, stdout, stderr)
		},
	}, args, getenv, stdout, stderr)
}

// env is the program's environment and streams.
type env struct {
	getenv         func(string) string
	stdin          io.Reader
	stdout, stderr io.Writer
}

func (e *env) wrap(f func(ctx context.Context, args []string) error) cli.RunFunc {
	return func(ctx context.Context, args []string, _ func(string) string, _, _ io.Writer) error {
		return f(ctx, args)
	}
}

// common are the settings every command shares.
type common struct {
	url, token, journal string
	tokenFile           string
	flags               *flag.FlagSet // to tell a flag from its variable
	attempts            int
	deadline            time.Duration
	json                bool
}

func (e *env) define(s *config.Set, c *common, withJournal bool) {
	c.flags = s.FlagSet()
	s.String(&c.url, "url", "QUILL_URL", defaultURL, "the Quill API's base URL")
	s.String(&c.token, "token", "QUILL_TOKEN", "",
		"bearer token (this or --token-file is required); as a flag it is visible to other users of this machine in the process list: prefer --token-file or QUILL_TOKEN")
	s.String(&c.tokenFile, "token-file", "QUILL_TOKEN_FILE", "",
		"file holding the bearer token on one line (not readable by others: chmod 600); instead of --token")
	if withJournal {
		s.String(&c.journal, "journal", "QUILL_JOURNAL", defaultJournal(e.getenv),
			"directory of the operation journal")
	}
	s.Int(&c.attempts, "attempts", "", defaultAttempts, 1, "most requests per operation")
	s.Duration(&c.deadline, "deadline", "", defaultDeadline, "total time per operation, retries and lookup included")
	s.FlagSet().BoolVar(&c.json, "json", false, "print JSON (one object; \"ops resume\": one per line)")
}

// defaultJournal is $XDG_STATE_HOME/quill/journal, falling back to
// ~/.local/state/quill/journal.
func defaultJournal(getenv func(string) string) string {
	if x := getenv("XDG_STATE_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "quill", "journal")
	}
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".local", "state", "quill", "journal")
}

// parseNone is parse for a command that takes no positional argument: one
// is a UsageError naming it.
func parseNone(s *config.Set, args []string) error {
	pos, err := parse(s, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.UsageError{Msg: fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	return nil
}

// parseOne is parse for a command that takes one positional argument, not
// empty: anything else is a UsageError showing synopsis.
func parseOne(s *config.Set, args []string, synopsis string) (string, error) {
	pos, err := parse(s, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 || pos[0] == "" {
		return "", cli.UsageError{Msg: "usage: " + synopsis}
	}
	return pos[0], nil
}

// parse reads flags and environment, allowing flags after positional
// arguments ("quill notes delete ID --json"); it returns the positionals.
func parse(s *config.Set, args []string) ([]string, error) {
	var flags, pos []string
	fs := s.FlagSet()
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // the parser reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if err := cli.Parse(s, flags); err != nil {
		return nil, err
	}
	return pos, nil
}

// maxTokenFileBytes bounds what a token file may hold (a token is 55
// bytes).
const maxTokenFileBytes = 4096

// resolveToken settles where the token comes from, flags over variables
// (decision 0043): --token or --token-file (not both), else QUILL_TOKEN or
// QUILL_TOKEN_FILE (not both). A token file is read here, only by commands
// that send, and its problems are usage errors naming it.
func (e *env) resolveToken(c *common) error {
	given := map[string]bool{}
	if c.flags != nil {
		c.flags.Visit(func(f *flag.Flag) { given[f.Name] = true })
	}
	switch {
	case given["token"] && given["token-file"]:
		return cli.UsageError{Msg: "pass --token or --token-file, not both"}
	case given["token"]:
		return nil
	case given["token-file"]:
	case c.tokenFile != "" && c.token != "":
		return cli.UsageError{Msg: "set QUILL_TOKEN or QUILL_TOKEN_FILE, not both"}
	case c.tokenFile == "":
		return nil
	}
	tok, err := readTokenFile(c.tokenFile)
	if err != nil {
		return cli.UsageError{Msg: fmt.Sprintf("token file %s: %v", c.tokenFile, err)}
	}
	c.token = tok
	return nil
}

// readTokenFile returns the token in path: a regular file, not readable by
// others (as ssh treats a private key; group-readable is allowed, for a
// service's group), holding one line of printable ASCII with at most one
// trailing newline.
func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", errors.Unwrap(err) // the *PathError names the path again
	}
	defer f.Close()
	st, err := f.Stat()
	switch {
	case err != nil:
		return "", err
	case !st.Mode().IsRegular():
		return "", errors.New("is not a regular file")
	case st.Mode().Perm()&0o004 != 0:
		return "", fmt.Errorf("is readable by every user of this machine (mode %04o): run chmod o-rwx on it", st.Mode().Perm())
	case st.Size() > maxTokenFileBytes:
		return "", fmt.Errorf("is %d bytes; a token file holds one token", st.Size())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
	if err != nil {
		return "", err
	}
	tok := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if tok == "" {
		return "", errors.New("is empty")
	}
	for _, r := range tok {
		if r < 0x21 || r > 0x7e {
			return "", errors.New("must hold only the token, on one line")
		}
	}
	return tok, nil
}

// newClient builds the API client; journal opens the journal too.
func (e *env) newClient(c common, journal bool) (*client.Client, error) {
	if err := e.resolveToken(&c); err != nil {
		return nil, err
	}
	if c.token == "" {
		return nil, cli.UsageError{Msg: "a token is required: set QUILL_TOKEN or QUILL_TOKEN_FILE, or pass --token-file or --token"}
	}
	cfg := client.Config{BaseURL: c.url, Token: c.token, Attempts: c.attempts, Deadline: c.deadline}
	if journal {
		j, err := client.OpenFileJournal(c.journal)
		if err != nil {
			return nil, fmt.Errorf("journal %s: %w", c.journal, err)
		}
		cfg.Journal = j
	}
	cl, err := client.New(cfg)
	if err != nil {
		return nil, cli.UsageError{Msg: err.Error()}
	}
	return cl, nil
}

func (e *env) printJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintln(e.stderr, "quill: encode output:", err)
		return
	}
	fmt.Fprintln(e.stdout, string(b))
}

// writeResult is the --json object of a write (SPEC §10).
type writeResult struct {
	OperationKey string `json:"operation_key"`
	State        string `json:"state"`
	Replayed     bool   `json:"replayed,omitempty"`
	Note         any    `json:"note,omitempty"`
	Error        any    `json:"error,omitempty"`
}

// errorObject is the "error" member for an outcome without a problem
// document from the server.
type errorObject struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
	Retry  string `json:"retry,omitempty"`
	Lookup string `json:"lookup,omitempty"`
}

// describeWriteError turns a write's error into its state, its "error"
// member and its exit status.
func describeWriteError(err error) (state string, obj any, code int) {
	var (
		refused *client.RefusedError
		unknown *client.UnknownOutcomeError
		usage   cli.UsageError
	)
	switch {
	case errors.As(err, &usage):
		return stateRefused, errorObject{Code: "usage", Detail: err.Error(), Retry: contract.RetryAfterFixing}, exitUsage
	case errors.As(err, &refused):
		return stateRefused, refused.Problem, exitRefused
	case errors.As(err, &unknown) && errors.Is(err, client.ErrSecretNotReceived):
		// Executed, but not done for the caller: the secret is only in
		// a replay of the answer, which a resend under the key brings.
		return stateUnknown, errorObject{Code: "secret_not_received", Detail: err.Error(), Retry: contract.RetrySameKey, Lookup: unknown.Lookup}, exitUnknown
	case errors.As(err, &unknown):
		return stateUnknown, errorObject{Code: "outcome_unknown", Detail: err.Error(), Retry: contract.RetrySameKey, Lookup: unknown.Lookup}, exitUnknown
	case errors.Is(err, client.ErrKeyTooOld):
		return stateUnknown, errorObject{Code: "key_too_old", Detail: err.Error(), Retry: contract.RetryNo}, exitFailure
	default:
		return stateUnknown, errorObject{Code: "failure", Detail: err.Error()}, exitFailure
	}
}

// reportWrite prints a write's outcome and returns run's error.
func (e *env) reportWrite(asJSON bool, key string, w *client.Write, resource any, human string, err error) error {
	if err == nil {
		if asJSON {
			e.printJSON(writeResult{OperationKey: w.Key, State: stateCompleted, Replayed: w.Replayed, Note: resource})
		} else {
			fmt.Fprintln(e.stdout, human)
		}
		return nil
	}
	state, obj, code := describeWriteError(err)
	if asJSON {
		e.printJSON(writeResult{OperationKey: key, State: state, Error: obj})
	} else {
		fmt.Fprintf(e.stderr, "quill: %s: %v\n", state, err)
		if state == stateUnknown && code == exitUnknown {
			fmt.Fprintf(e.stderr, "quill: operation key %s — run \"quill ops get %s\" or \"quill ops resume\"; do not repeat the write with a new key\n", key, key)
		}
	}
	return exitError{code: code, err: err}
}

// reportRead prints a read's failure and returns run's error: a problem
// from the server is final (3), anything else is a failure (5).
func (e *env) reportRead(asJSON bool, err error) error {
	var p *client.Problem
	code := exitFailure
	var obj any = errorObject{Code: "failure", Detail: err.Error()}
	if errors.As(err, &p) {
		code, obj = exitRefused, p
	}
	if asJSON {
		e.printJSON(map[string]any{"error": obj})
	} else {
		fmt.Fprintln(e.stderr, "quill:", err)
	}
	return exitError{code: code, err: err}
}
