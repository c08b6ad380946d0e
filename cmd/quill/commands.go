package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/httpserve"
	"github.com/quillhq/quill/internal/mcpserver"
)

func (e *env) set(name, synopsis string) *config.Set {
	return config.New(name, synopsis, e.getenv, e.stderr)
}

// writer opens the client of a write and returns it with the write's
// operation key: --key when it was given — checked before anything is
// opened or sent — else a new one.
func (e *env) writer(c common, fs *flag.FlagSet, flagKey string) (*client.Client, string, error) {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "key" })
	key := ""
	if set {
		k, err := opkey.Parse(flagKey)
		if err != nil {
			return nil, "", cli.UsageError{Msg: "--key: " + err.Error()}
		}
		key = k
	}
	cl, err := e.newClient(c, true)
	if err != nil {
		return nil, "", err
	}
	if key == "" {
		key = cl.NewKey()
	}
	return cl, key, nil
}

func (e *env) notesCreate(ctx context.Context, args []string) error {
	var (
		c                                     common
		title, body, attach, contentType, key string
	)
	s := e.set("quill notes create", "quill notes create --title T [--body B] [--attach FILE] [--content-type CT] [--key K]")
	e.define(s, &c, true)
	fs := s.FlagSet()
	fs.StringVar(&title, "title", "", "the note's title, 1–200 characters (required)")
	fs.StringVar(&body, "body", "", "the note's body")
	fs.StringVar(&attach, "attach", "", "a file to attach")
	fs.StringVar(&contentType, "content-type", "", "the attachment's content type (default: from the file name, else sniffed)")
	fs.StringVar(&key, "key", "", "the operation key of this intent (default: a new one); reuse it only to retry the same intent")
	if err := parseNone(s, args); err != nil {
		return err
	}
	switch {
	case title == "":
		return cli.UsageError{Msg: "--title is required"}
	case utf8.RuneCountInString(title) > 200:
		return cli.UsageError{Msg: "--title is longer than 200 characters"}
	}
	n := client.NewNote{Title: title, Body: body}
	if attach != "" {
		data, err := os.ReadFile(attach)
		if err != nil {
			return cli.UsageError{Msg: fmt.Sprintf("--attach: %v", err)}
		}
		if contentType == "" {
			contentType = mime.TypeByExtension(filepath.Ext(attach))
		}
		if contentType == "" {
			contentType = http.DetectContentType(data)
		}
		n.Attachment = &client.NewAttachment{Filename: filepath.Base(attach), ContentType: contentType, Data: data}
	}
	cl, k, err := e.writer(c, s.FlagSet(), key)
	if err != nil {
		return err
	}
	res, err := cl.CreateNote(ctx, n, client.WithKey(k))
	if err != nil {
		return e.reportWrite(c.json, k, nil, nil, "", err)
	}
	how := "created"
	if res.Replayed {
		how = "created (replayed: an earlier delivery had executed it)"
	}
	return e.reportWrite(c.json, k, &res.Write, res.Note,
		fmt.Sprintf("%s note %s %q\noperation key: %s", how, res.Note.ID, res.Note.Title, res.Key), nil)
}

// ifVersionFlag reads --if-version, a note's version (1..client.MaxVersion,
// decimal without leading zeros, as If-Match takes it). It is a string
// flag checked after parsing, so that a bad value is one line like the
// command's other mistakes, not the flag package's usage text.
type ifVersionFlag struct {
	raw string
	n   int
}

func (v *ifVersionFlag) define(fs *flag.FlagSet, usage string) {
	fs.StringVar(&v.raw, "if-version", "", usage)
}

// parse returns whether --if-version was given, or a UsageError for a
// value that is not a version.
func (v *ifVersionFlag) parse(fs *flag.FlagSet) (bool, error) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "if-version" })
	if !given {
		return false, nil
	}
	n, err := strconv.Atoi(v.raw)
	if err != nil || n < 1 || n > client.MaxVersion || strconv.Itoa(n) != v.raw {
		return false, cli.UsageError{Msg: fmt.Sprintf("--if-version %q is not a version (1..%d)", v.raw, client.MaxVersion)}
	}
	v.n = n
	return true, nil
}

// noteID returns the canonical form of a note id given on the command
// line, or a UsageError: ids are UUIDs, and anything else could only be
// answered not_found.
func noteID(s, synopsis string) (string, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return "", cli.UsageError{Msg: fmt.Sprintf("ID %q is not a note id (a UUID); usage: %s", s, synopsis)}
	}
	return id.String(), nil
}

func (e *env) notesUpdate(ctx context.Context, args []string) error {
	var (
		c                common
		title, body, key string
		ifVersion        ifVersionFlag
	)
	const synopsis = "quill notes update ID --if-version N [--title T] [--body B] [--key K]"
	s := e.set("quill notes update", synopsis)
	e.define(s, &c, true)
	fs := s.FlagSet()
	ifVersion.define(fs, "the note's version this update was decided on, as \"quill notes get ID\" shows it (required): a note at another version is refused")
	fs.StringVar(&title, "title", "", "the note's new title, 1–200 characters (default: kept)")
	fs.StringVar(&body, "body", "", "the note's new body; \"\" empties it (default: kept)")
	fs.StringVar(&key, "key", "", "the operation key of this intent (default: a new one); reuse it only to retry the same intent")
	pos, err := parseOne(s, args, synopsis)
	if err != nil {
		return err
	}
	id, err := noteID(pos, synopsis)
	if err != nil {
		return err
	}
	hasVersion, err := ifVersion.parse(fs)
	if err != nil {
		return err
	}
	var fields client.NoteUpdate
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "title":
			fields.Title = &title
		case "body":
			fields.Body = &body
		}
	})
	switch {
	case !hasVersion:
		return cli.UsageError{Msg: "--if-version is required: the version of the note you read (quill notes get ID)"}
	case fields.Title == nil && fields.Body == nil:
		return cli.UsageError{Msg: "nothing to update: give --title, --body or both"}
	case fields.Title != nil && title == "":
		return cli.UsageError{Msg: "--title must not be empty"}
	case fields.Title != nil && utf8.RuneCountInString(title) > 200:
		return cli.UsageError{Msg: "--title is longer than 200 characters"}
	}
	cl, k, err := e.writer(c, fs, key)
	if err != nil {
		return err
	}
	res, err := cl.UpdateNote(ctx, id, ifVersion.n, fields, k)
	if err != nil {
		return e.reportEdit(c.json, k, id, ifVersion.n, err)
	}
	how := fmt.Sprintf("updated note %s to version %d %q", res.Note.ID, res.Note.Version, res.Note.Title)
	if res.Note.Version == ifVersion.n {
		how = fmt.Sprintf("note %s unchanged at version %d: it already had these values", res.Note.ID, res.Note.Version)
	}
	if res.Replayed {
		how += " (replayed: an earlier delivery had executed it)"
	}
	return e.reportWrite(c.json, k, &res.Write, res.Note, how+"\noperation key: "+res.Key, nil)
}

// reportEdit reports a failed write made under --if-version: a 412 is
// one line naming the note's current version and what to do; anything
// else is reported as every write's.
func (e *env) reportEdit(asJSON bool, key, id string, ifVersion int, err error) error {
	var refused *client.RefusedError
	if asJSON || !errors.As(err, &refused) || refused.Problem.Code != contract.CodePreconditionFailed {
		return e.reportWrite(asJSON, key, nil, nil, "", err)
	}
	current := "another version"
	if v := refused.Problem.CurrentVersion; v > 0 {
		current = "version " + strconv.Itoa(v)
	}
	fmt.Fprintf(e.stderr, "quill: refused: %s: the note is at %s, not %d (operation key %s); read it again (quill notes get %s) and decide\n",
		contract.CodePreconditionFailed, current, ifVersion, key, id)
	return exitError{code: exitRefused, err: err}
}

func (e *env) notesDelete(ctx context.Context, args []string) error {
	var (
		c         common
		key       string
		ifVersion ifVersionFlag
	)
	const synopsis = "quill notes delete ID [--if-version N] [--key K]"
	s := e.set("quill notes delete", synopsis)
	e.define(s, &c, true)
	s.FlagSet().StringVar(&key, "key", "", "the operation key of this intent (default: a new one)")
	ifVersion.define(s.FlagSet(), "delete only if the note is still at this version (default: whatever its version)")
	id, err := parseOne(s, args, synopsis)
	if err != nil {
		return err
	}
	hasVersion, err := ifVersion.parse(s.FlagSet())
	if err != nil {
		return err
	}
	cl, k, err := e.writer(c, s.FlagSet(), key)
	if err != nil {
		return err
	}
	var res *client.Deleted
	if hasVersion {
		res, err = cl.DeleteNoteIfVersion(ctx, id, ifVersion.n, client.WithKey(k))
	} else {
		res, err = cl.DeleteNote(ctx, id, client.WithKey(k))
	}
	if err != nil {
		return e.reportEdit(c.json, k, id, ifVersion.n, err)
	}
	return e.reportWrite(c.json, k, &res.Write, res.Deletion,
		fmt.Sprintf("deleted note %s at %s\noperation key: %s", res.Deletion.ID,
			res.Deletion.DeletedAt.Format("2006-01-02T15:04:05Z07:00"), res.Key), nil)
}

func (e *env) notesGet(ctx context.Context, args []string) error {
	var c common
	const synopsis = "quill notes get ID"
	s := e.set("quill notes get", synopsis)
	e.define(s, &c, false)
	id, err := parseOne(s, args, synopsis)
	if err != nil {
		return err
	}
	cl, err := e.newClient(c, false)
	if err != nil {
		return err
	}
	n, err := cl.GetNote(ctx, id)
	if err != nil {
		return e.reportRead(c.json, err)
	}
	if c.json {
		e.printJSON(n)
		return nil
	}
	e.printNote(*n)
	return nil
}

func (e *env) printNote(n client.Note) {
	fmt.Fprintf(e.stdout, "id:      %s\ntitle:   %s\ncreated: %s\n", n.ID, n.Title, n.CreatedAt.Format("2006-01-02T15:04:05Z07:00"))
	if n.Version > 0 {
		fmt.Fprintf(e.stdout, "version: %d (updated %s)\n", n.Version, n.UpdatedAt.Format("2006-01-02T15:04:05Z07:00"))
	}
	if a := n.Attachment; a != nil {
		fmt.Fprintf(e.stdout, "attachment: %s (%s, %d bytes, %s)\n", a.Filename, a.ContentType, a.Size, a.Status)
	}
	if n.Body != "" {
		fmt.Fprintf(e.stdout, "\n%s\n", n.Body)
	}
}

func (e *env) notesList(ctx context.Context, args []string) error {
	var (
		c      common
		limit  int
		cursor string
	)
	s := e.set("quill notes list", "quill notes list [--limit N] [--cursor C]")
	e.define(s, &c, false)
	s.FlagSet().IntVar(&limit, "limit", 0, "notes per page, 1–100 (default: the server's, 50)")
	s.FlagSet().StringVar(&cursor, "cursor", "", "the next_cursor of the previous page")
	if err := parseNone(s, args); err != nil {
		return err
	}
	if limit < 0 || limit > 100 {
		return cli.UsageError{Msg: "--limit must be 1–100"}
	}
	cl, err := e.newClient(c, false)
	if err != nil {
		return err
	}
	l, err := cl.ListNotes(ctx, client.ListOptions{Limit: limit, Cursor: cursor})
	if err != nil {
		return e.reportRead(c.json, err)
	}
	if c.json {
		out := struct {
			Items      []client.Note `json:"items"`
			NextCursor *string       `json:"next_cursor"`
		}{Items: l.Items}
		if out.Items == nil {
			out.Items = []client.Note{}
		}
		if l.NextCursor != "" {
			out.NextCursor = &l.NextCursor
		}
		e.printJSON(out)
		return nil
	}
	for _, n := range l.Items {
		fmt.Fprintf(e.stdout, "%s  %s  %s\n", n.ID, n.CreatedAt.Format("2006-01-02T15:04:05Z"), n.Title)
	}
	if l.NextCursor != "" {
		fmt.Fprintf(e.stdout, "more: quill notes list --cursor %s\n", l.NextCursor)
	}
	return nil
}

func (e *env) opsGet(ctx context.Context, args []string) error {
	var c common
	s := e.set("quill ops get", "quill ops get KEY")
	e.define(s, &c, false)
	pos, err := parse(s, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return cli.UsageError{Msg: "usage: quill ops get KEY"}
	}
	key, err := opkey.Parse(pos[0])
	if err != nil {
		return cli.UsageError{Msg: "KEY: " + err.Error()}
	}
	cl, err := e.newClient(c, false)
	if err != nil {
		return err
	}
	op, err := cl.GetOperation(ctx, key)
	var p *client.Problem
	if errors.As(err, &p) && p.Code == contract.CodeOpNotFound {
		// An answer, not a failure: nothing with this key is recorded or
		// executing; sending the write again with it executes it.
		if c.json {
			e.printJSON(map[string]string{"operation_key": key, "state": "not_found"})
		} else {
			fmt.Fprintf(e.stdout, "operation %s: not_found (nothing recorded or executing with this key)\n", key)
		}
		return nil
	}
	if err != nil {
		return e.reportRead(c.json, err)
	}
	if c.json {
		fmt.Fprintln(e.stdout, string(op.Raw))
		return nil
	}
	fmt.Fprintf(e.stdout, "operation %s: %s %s\n", op.Key, op.Action, op.State)
	if op.Response != nil {
		fmt.Fprintf(e.stdout, "response: %d %s\n", op.Response.Status, op.Response.Body)
	}
	for _, ef := range op.Effects {
		if ef.Kind == client.EffectWebhook {
			// A delivery: the event it carries in the id's column, then
			// its endpoint, attempts and last answer.
			last := "-"
			if ef.LastStatus != nil {
				last = strconv.Itoa(*ef.LastStatus)
			}
			fmt.Fprintf(e.stdout, "effect: %s - %s %s endpoint=%s attempts=%d last_status=%s\n",
				ef.Kind, orDash(ef.EventID), ef.State, orDash(ef.EndpointID), ef.Attempts, last)
			continue
		}
		// An attachment has no type and a forgotten event no id: "-"
		// keeps the columns (kind type id state) in place.
		fmt.Fprintf(e.stdout, "effect: %s %s %s %s\n", ef.Kind, orDash(ef.Type), orDash(ef.ID), ef.State)
	}
	return nil
}

// orDash is s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// resumeLine is one --json line of ops resume.
type resumeLine struct {
	OperationKey string `json:"operation_key"`
	Action       string `json:"action"`
	State        string `json:"state"`
	Replayed     bool   `json:"replayed,omitempty"`
	Note         any    `json:"note,omitempty"`
	// Webhook and Secret: a webhook write's, as webhookResult has them.
	Webhook any    `json:"webhook,omitempty"`
	Secret  string `json:"secret,omitempty"`
	Error   any    `json:"error,omitempty"`
}

// journalled reads the settings of a command that has only the common ones
// and no arguments, and opens its client with the journal.
func (e *env) journalled(name, synopsis string, args []string) (*client.Client, common, error) {
	var c common
	s := e.set(name, synopsis)
	e.define(s, &c, true)
	if err := parseNone(s, args); err != nil {
		return nil, c, err
	}
	cl, err := e.newClient(c, true)
	return cl, c, err
}

func (e *env) opsResume(ctx context.Context, args []string) error {
	cl, c, err := e.journalled("quill ops resume", "quill ops resume", args)
	if err != nil {
		return err
	}
	results, jerr := cl.Resume(ctx)
	if jerr != nil && !errors.Is(jerr, client.ErrCorruptRecord) {
		return jerr
	}
	code := exitOK
	for _, r := range results {
		line := resumeLine{OperationKey: r.Entry.Key, Action: r.Entry.Action}
		switch {
		case r.Err == nil && r.Created != nil:
			line.State, line.Replayed, line.Note = stateCompleted, r.Created.Replayed, r.Created.Note
		case r.Err == nil && r.Updated != nil:
			line.State, line.Replayed, line.Note = stateCompleted, r.Updated.Replayed, r.Updated.Note
		case r.Err == nil && r.Deleted != nil:
			line.State, line.Replayed, line.Note = stateCompleted, r.Deleted.Replayed, r.Deleted.Deletion
		case r.Err == nil && r.WebhookCreated != nil:
			w := r.WebhookCreated
			line.State, line.Replayed, line.Webhook, line.Secret = stateCompleted, w.Replayed, viewCreated(w.Webhook), w.Secret
		case r.Err == nil && r.WebhookSecretRotated != nil:
			w := r.WebhookSecretRotated
			line.State, line.Replayed, line.Secret = stateCompleted, w.Replayed, w.Secret
			line.Webhook = rotationView{ID: w.ID, PreviousSecretExpiresAt: w.PreviousSecretExpiresAt}
		case r.Err == nil && r.WebhookDeleted != nil:
			line.State, line.Replayed, line.Webhook = stateCompleted, r.WebhookDeleted.Replayed, r.WebhookDeleted.Deletion
		default:
			line.State, line.Error, _ = describeWriteError(r.Err)
			if line.State != stateRefused {
				code = exitUnknown // still unsettled
			}
		}
		if c.json {
			e.printJSON(line)
			continue
		}
		msg := ""
		switch {
		case r.Err != nil:
			msg = r.Err.Error()
		case r.Created != nil:
			msg = fmt.Sprintf("note %s %q", r.Created.Note.ID, r.Created.Note.Title)
		case r.Updated != nil:
			msg = fmt.Sprintf("note %s at version %d %q", r.Updated.Note.ID, r.Updated.Note.Version, r.Updated.Note.Title)
		case r.Deleted != nil:
			msg = "deleted note " + r.Deleted.Deletion.ID
		case r.WebhookCreated != nil:
			msg = fmt.Sprintf("webhook endpoint %s %s; secret: %s", r.WebhookCreated.Webhook.ID, r.WebhookCreated.Webhook.URL, r.WebhookCreated.Secret)
		case r.WebhookSecretRotated != nil:
			msg = fmt.Sprintf("rotated the secret of webhook endpoint %s; secret: %s", r.WebhookSecretRotated.ID, r.WebhookSecretRotated.Secret)
		case r.WebhookDeleted != nil:
			msg = "deleted webhook endpoint " + r.WebhookDeleted.Deletion.ID
		}
		fmt.Fprintf(e.stdout, "%s %s %s: %s\n", line.OperationKey, line.Action, line.State, msg)
	}
	for _, r := range results {
		if r.Err == nil && (r.WebhookCreated != nil || r.WebhookSecretRotated != nil) {
			fmt.Fprintln(e.stderr, secretNotice)
			break
		}
	}
	if jerr != nil {
		fmt.Fprintln(e.stderr, "quill: journal:", jerr)
		if code == exitOK {
			code = exitFailure
		}
	}
	if !c.json && len(results) == 0 && jerr == nil {
		fmt.Fprintln(e.stdout, "nothing to resume: every journalled operation is settled")
	}
	if code != exitOK {
		return exitError{code: code, err: errors.New("not every operation is settled")}
	}
	return nil
}

// opsPrune removes settled journal records older than --older-than and
// reports unsettled operations past the key retention, removing them only
// with --abandon. Exit 4 while such operations are kept: their outcome may
// never be known. The key retention is --key-retention (QUILL_KEY_RETENTION)
// when given, else the server's (GET /v1/limits) when a token is set and
// the server answers, else client.DefaultKeyRetention — the longer horizon,
// which reports fewer operations as past it and so removes none that could
// still be resumed.
func (e *env) opsPrune(ctx context.Context, args []string) error {
	var (
		dir              string
		olderThan, keyTT time.Duration
		abandon, asJSON  bool
		c                common
	)
	s := e.set("quill ops prune", "quill ops prune [--older-than D] [--key-retention D] [--abandon] [--journal DIR] [--json] [--url U] [--token-file F]")
	s.String(&dir, "journal", "QUILL_JOURNAL", defaultJournal(e.getenv), "directory of the operation journal")
	s.DurationOrZero(&olderThan, "older-than", "", client.DefaultKeyRetention,
		"remove the records of operations settled longer ago than this")
	s.Duration(&keyTT, "key-retention", "QUILL_KEY_RETENTION", client.DefaultKeyRetention,
		"the server's key retention: an unsettled operation first sent longer ago can no longer be resumed (default: the server's, read with --url and the token when one is set, else 720h)")
	fs := s.FlagSet()
	c.flags = fs
	s.String(&c.url, "url", "QUILL_URL", defaultURL, "the Quill API's base URL, asked for its key retention")
	s.String(&c.token, "token", "QUILL_TOKEN", "", "bearer token, to ask the server for its key retention (optional)")
	s.String(&c.tokenFile, "token-file", "QUILL_TOKEN_FILE", "", "file holding the bearer token; instead of --token")
	fs.BoolVar(&abandon, "abandon", false, "also remove unsettled operations past the key retention (their outcome stays unknown)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object")
	if err := parseNone(s, args); err != nil {
		return err
	}
	if olderThan <= 0 || keyTT <= 0 {
		return cli.UsageError{Msg: "--older-than and --key-retention must be positive"}
	}
	given := e.getenv("QUILL_KEY_RETENTION") != ""
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "key-retention" })
	if !given {
		server, note, err := e.serverKeyRetention(ctx, c)
		if err != nil {
			return err
		}
		if server > 0 {
			keyTT = server
		} else {
			fmt.Fprintf(e.stderr, "quill: %s; taking the key retention as %s (--key-retention sets it)\n", note, keyTT)
		}
	}
	j, err := client.OpenFileJournal(dir)
	if err != nil {
		return fmt.Errorf("journal %s: %w", dir, err)
	}
	now := time.Now()
	res, perr := j.Prune(ctx, now.Add(-olderThan), now.Add(-keyTT), abandon)
	if asJSON {
		e.printJSON(res)
	} else {
		fmt.Fprintf(e.stdout, "removed %d settled operations (settled more than %s ago)\n", len(res.Removed), olderThan)
		for _, k := range res.Abandoned {
			fmt.Fprintf(e.stdout, "abandoned %s: unsettled, past the key retention (%s); its outcome stays unknown\n", k, keyTT)
		}
		for _, x := range res.Expired {
			fmt.Fprintf(e.stdout, "kept %s %s: unsettled and first sent %s, past the key retention (%s) — \"quill ops get %s\" may still answer; --abandon removes it\n",
				x.Key, x.Action, x.CreatedAt.UTC().Format(time.RFC3339), keyTT, x.Key)
		}
	}
	if perr != nil {
		fmt.Fprintln(e.stderr, "quill: journal:", perr)
		return exitError{code: exitFailure, err: perr}
	}
	if len(res.Expired) > 0 {
		return exitError{code: exitUnknown, err: errors.New("unsettled operations past the key retention")}
	}
	return nil
}

// serverKeyRetention asks the server for its key retention, for prune. No
// token is not an error (prune works on the journal alone): it returns 0
// and why, as it does when the server cannot be asked; a token file that
// cannot be read is a usage error.
func (e *env) serverKeyRetention(ctx context.Context, c common) (time.Duration, string, error) {
	if err := e.resolveToken(&c); err != nil {
		return 0, "", err
	}
	if c.token == "" {
		return 0, "no token is set, so the server's key retention was not read", nil
	}
	cl, err := client.New(client.Config{BaseURL: c.url, Token: c.token, Attempts: 2, Deadline: pruneLimitsDeadline})
	if err != nil {
		return 0, "", cli.UsageError{Msg: err.Error()}
	}
	l, err := cl.Limits(ctx)
	if err != nil {
		return 0, fmt.Sprintf("the server's key retention could not be read: %v", err), nil
	}
	return l.KeyRetention, "", nil
}

// pruneLimitsDeadline bounds prune's question to the server: an unreachable
// server delays a local command by no more.
const pruneLimitsDeadline = 5 * time.Second

// version is the MCP server's implementation version.
const version = "1"

func (e *env) mcp(ctx context.Context, args []string) error {
	var (
		c    common
		addr string
		h    mcpHTTPSettings
	)
	s := e.set("quill mcp", "quill mcp [--http ADDR] — an MCP server on stdin/stdout (with --http, over MCP's streamable HTTP at http://ADDR/mcp) "+
		"with the tools create_note, update_note, delete_note, get_note, get_operation, list_operations, list_webhooks and get_webhook")
	e.define(s, &c, true)
	s.FlagSet().StringVar(&addr, "http", "", "serve over MCP's streamable HTTP on ADDR (host:port), path /mcp, instead of stdio; "+
		"each caller's Authorization header is its token, and each token has its own journal under --journal")
	s.String(&h.origins, "allowed-origins", "QUILL_MCP_ALLOWED_ORIGINS", "",
		"with --http: comma-separated origins (scheme://host[:port]) whose browser pages may call the server, besides its own address's; a request with any other Origin is answered 403")
	s.Duration(&h.sessionTimeout, "session-timeout", "QUILL_MCP_SESSION_TIMEOUT", mcpserver.DefaultSessionTimeout,
		"with --http: a session without a request for this long is closed (its Mcp-Session-Id then answers 404 and the client opens a new session)")
	// With --http, the server's connections have every server's limits.
	h.conns.Define(s)
	if err := parseNone(s, args); err != nil {
		return err
	}
	// Logs go to stderr: on stdio, stdout is the protocol.
	log := zerolog.New(e.stderr).With().Timestamp().Str("cmd", "quill mcp").Logger()
	httpGiven := false
	s.FlagSet().Visit(func(f *flag.Flag) { httpGiven = httpGiven || f.Name == "http" })
	if httpGiven {
		return e.mcpHTTP(ctx, c, addr, h, log)
	}
	cl, err := e.newClient(c, true)
	if err != nil {
		return err
	}
	srv := mcpserver.New(cl, mcpserver.Config{Version: version, Log: log})
	t := &mcpsdk.IOTransport{Reader: io.NopCloser(e.stdin), Writer: nopWriteCloser{e.stdout}}
	if err := srv.Run(ctx, t); err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// mcpHTTPSettings are the settings of quill mcp --http alone.
type mcpHTTPSettings struct {
	origins        string
	sessionTimeout time.Duration
	conns          httpserve.Settings
}

// mcpHTTP serves quill mcp --http ADDR until ctx ends (SIGTERM, SIGINT).
// No token of its own is used: each caller brings its own (decision 0049).
func (e *env) mcpHTTP(ctx context.Context, c common, addr string, h mcpHTTPSettings, log zerolog.Logger) error {
	given := map[string]bool{}
	c.flags.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["token"] || given["token-file"] {
		return cli.UsageError{Msg: "--http takes no --token or --token-file: each caller's Authorization header is its token"}
	}
	host, port, err := net.SplitHostPort(addr)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		return cli.UsageError{Msg: fmt.Sprintf("--http %q: want host:port, such as 127.0.0.1:8090", addr)}
	}
	tmpl := client.Config{BaseURL: c.url, Attempts: c.attempts, Deadline: c.deadline}
	probe := tmpl
	probe.Token = "x"
	if _, err := client.New(probe); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	origins, err := mcpserver.ParseAllowedOrigins(h.origins)
	if err != nil {
		return cli.UsageError{Msg: "--allowed-origins (QUILL_MCP_ALLOWED_ORIGINS): " + err.Error()}
	}
	if c.token != "" || c.tokenFile != "" {
		fmt.Fprintln(e.stderr, "quill mcp: QUILL_TOKEN and QUILL_TOKEN_FILE are ignored with --http: each caller's Authorization header is its token")
	}
	ln, err := h.conns.Listen(net.JoinHostPort(host, port))
	if err != nil {
		return fmt.Errorf("mcp --http: %w", err)
	}
	return mcpserver.ServeHTTP(ctx, ln, mcpserver.HTTPConfig{Client: tmpl, JournalDir: c.journal, Version: version, Log: log,
		AllowedOrigins: origins, SessionTimeout: h.sessionTimeout, TrustedProxies: h.conns.TrustedProxies})
}
