package daemon

import (
	"cmp"
	"context"
	"io"
	"maps"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
)

// Program is a daemon's command line: its own command ("run", the
// default), parses the shared Settings and the daemon's own and starts the
// daemon; "probe" asks a running one's admin address whether it is ready
// (or alive, --live); Commands are its operator commands.
type Program struct {
	// Name is the program's name, as in its usage lines: "relay".
	Name string
	// Command is the daemon's own command, the default; "run" when empty
	// (the api's is "serve").
	Command string
	// Overview lists the program's commands, for --help and help.
	Overview string
	// About says what run does, under its usage line in run --help.
	About string
	// AdminAddr is the default admin address (QUILL_ADMIN_ADDR).
	AdminAddr string
	// NATS says what NATS is for, in --help; "NATS with JetStream" when
	// empty.
	NATS string
	// Removed are the settings the daemon no longer reads: Start warns
	// about each one the environment still sets, naming its fixed value.
	Removed []config.Removed
	// Define registers the daemon's own settings on s, after the shared
	// ones.
	Define func(s *config.Set)
	// Start runs the daemon with the parsed shared settings, once Define's
	// have been parsed too.
	Start func(ctx context.Context, s Settings, stderr io.Writer) error
	// Commands are the operator commands by name, besides run.
	Commands map[string]cli.RunFunc
}

// Main runs the command args name, as cli.Dispatch does, with run as the
// default. It returns the command's error: for run, flag.ErrHelp for
// --help, a cli.UsageError for a bad setting or an argument, or Start's
// error.
func (p Program) Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmds := maps.Clone(p.Commands)
	if cmds == nil {
		cmds = map[string]cli.RunFunc{}
	}
	cmd := cmp.Or(p.Command, "run")
	cmds[cmd] = p.run
	if _, own := cmds["probe"]; !own {
		cmds["probe"] = p.probe
	}
	return cli.Dispatch(ctx, p.Name, p.Overview, cmd, cmds, args, getenv, stdout, stderr)
}

func (p Program) run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := cmp.Or(p.Command, "run")
	c := Settings{Getenv: getenv, Stdout: stdout, NotifySocket: getenv(NotifySocketEnv)}
	s := config.New(p.Name+" "+cmd, "usage: "+p.Name+" ["+cmd+"] [flags]\n\n"+p.About, getenv, stdout)
	c.Define(s, p.AdminAddr, cmp.Or(p.NATS, "NATS with JetStream"))
	p.Define(s)
	s.Remove(p.Removed...)
	if err := parse(s, args); err != nil {
		return err
	}
	c.removed = s.StillSet()
	return p.Start(ctx, c, stderr)
}
