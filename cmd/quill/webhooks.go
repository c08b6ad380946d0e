package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
)

// secretNotice follows every secret quill prints, on stderr, so that it is
// seen even when stdout goes to a file or a pipe.
const secretNotice = "quill: this secret will not be shown again (no read shows it): store it now where your webhook receiver reads it"

// webhookResult is the --json object of a webhook write: writeResult with
// the endpoint (or the rotation's or deletion's answer) as "webhook" and,
// for a create or a rotation, the secret.
type webhookResult struct {
	OperationKey string `json:"operation_key"`
	State        string `json:"state"`
	Replayed     bool   `json:"replayed,omitempty"`
	Webhook      any    `json:"webhook,omitempty"`
	Secret       string `json:"secret,omitempty"`
	Error        any    `json:"error,omitempty"`
}

// rotationView is what --json shows of a rotation besides its secret.
type rotationView struct {
	ID                      string    `json:"id"`
	PreviousSecretExpiresAt time.Time `json:"previous_secret_expires_at"`
}

// createdView is what --json shows of a created endpoint besides its
// secret: the create's answer, without the health no delivery made yet.
type createdView struct {
	ID          string    `json:"id"`
	URL         string    `json:"url"`
	EventTypes  []string  `json:"event_types"`
	Description string    `json:"description"`
	CreatedAt   time.Time `json:"created_at"`
	State       string    `json:"state"`
}

func viewCreated(w client.Webhook) createdView {
	return createdView{ID: w.ID, URL: w.URL, EventTypes: w.EventTypes, Description: w.Description, CreatedAt: w.CreatedAt, State: w.State}
}

// eventTypesFlag collects --event-type, repeated or comma-separated; a
// value is a CloudEvents type (quill.note.created.v1) or an event type
// (note.created), sent as the CloudEvents type. The values are checked
// after parsing (types), so that a bad one is one line like the command's
// other mistakes, not the flag package's usage text.
type eventTypesFlag struct{ raw []string }

func (f *eventTypesFlag) String() string { return strings.Join(f.raw, ",") }

func (f *eventTypesFlag) Set(v string) error {
	f.raw = append(f.raw, strings.Split(v, ",")...)
	return nil
}

// types returns the CloudEvents types given, each once, or a UsageError
// naming the first that is not one of Quill's.
func (f *eventTypesFlag) types() ([]string, error) {
	var out []string
	for _, v := range f.raw {
		t := strings.TrimSpace(v)
		if slices.Contains(contract.EventTypes(), t) {
			t = contract.CloudEventType(t)
		}
		if _, ok := contract.EventTypeOf(t); !ok {
			return nil, cli.UsageError{Msg: fmt.Sprintf("--event-type %q is not one of Quill's event types: %s", t, strings.Join(cloudEventTypes(), ", "))}
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

func cloudEventTypes() []string {
	var out []string
	for _, t := range contract.EventTypes() {
		out = append(out, contract.CloudEventType(t))
	}
	return out
}

// webhookID returns the canonical form of an endpoint id given on the
// command line, or a UsageError: ids are UUIDs, and anything else could
// only be answered not_found.
func webhookID(s, synopsis string) (string, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return "", cli.UsageError{Msg: fmt.Sprintf("ID %q is not a webhook endpoint id (a UUID); usage: %s", s, synopsis)}
	}
	return id.String(), nil
}

func (e *env) webhooksCreate(ctx context.Context, args []string) error {
	var (
		c                common
		description, key string
		types            eventTypesFlag
	)
	// The endpoint's URL is the argument: --url is the API's.
	const synopsis = "quill webhooks create URL --event-type TYPE [--event-type TYPE…] [--description D] [--key K]"
	s := e.set("quill webhooks create", synopsis)
	e.define(s, &c, true)
	fs := s.FlagSet()
	fs.Var(&types, "event-type", "an event type to deliver, such as quill.note.created.v1 or note.created (required; repeat it, or separate by commas)")
	fs.StringVar(&description, "description", "", "for your own use, up to 256 bytes")
	fs.StringVar(&key, "key", "", "the operation key of this intent (default: a new one); the same key again shows the same secret")
	url, err := parseOne(s, args, synopsis)
	if err != nil {
		return err
	}
	eventTypes, err := types.types()
	switch {
	case err != nil:
		return err
	case len(eventTypes) == 0:
		return cli.UsageError{Msg: "--event-type is required: " + strings.Join(cloudEventTypes(), ", ")}
	}
	cl, k, err := e.writer(c, fs, key)
	if err != nil {
		return err
	}
	res, err := cl.CreateWebhook(ctx, client.NewWebhook{URL: url, EventTypes: eventTypes, Description: description}, client.WithKey(k))
	if err != nil {
		return e.reportWebhookWrite(c.json, k, err)
	}
	if c.json {
		e.printJSON(webhookResult{OperationKey: k, State: stateCompleted, Replayed: res.Replayed, Webhook: viewCreated(res.Webhook), Secret: res.Secret})
	} else {
		how := "created"
		if res.Replayed {
			how = "created (replayed: an earlier delivery had executed it)"
		}
		fmt.Fprintf(e.stdout, "%s webhook endpoint %s %s (%s)\nsecret: %s\noperation key: %s\n", how, res.Webhook.ID, res.Webhook.URL,
			strings.Join(res.Webhook.EventTypes, ", "), res.Secret, k)
	}
	fmt.Fprintln(e.stderr, secretNotice)
	return nil
}

// endpointWrite parses the command line of a write on one endpoint
// (rotate-secret, delete: ID and --key) and returns its client, operation
// key, endpoint id and common settings, or a cli.UsageError.
func (e *env) endpointWrite(args []string, cmd, keyUsage string) (*client.Client, string, string, common, error) {
	var (
		c   common
		key string
	)
	synopsis := "quill webhooks " + cmd + " ID [--key K]"
	s := e.set("quill webhooks "+cmd, synopsis)
	e.define(s, &c, true)
	s.FlagSet().StringVar(&key, "key", "", keyUsage)
	pos, err := parseOne(s, args, synopsis)
	if err != nil {
		return nil, "", "", c, err
	}
	id, err := webhookID(pos, synopsis)
	if err != nil {
		return nil, "", "", c, err
	}
	cl, k, err := e.writer(c, s.FlagSet(), key)
	return cl, k, id, c, err
}

func (e *env) webhooksRotate(ctx context.Context, args []string) error {
	cl, k, id, c, err := e.endpointWrite(args, "rotate-secret",
		"the operation key of this intent (default: a new one); the same key again shows the same secret, never makes another")
	if err != nil {
		return err
	}
	res, err := cl.RotateWebhookSecret(ctx, id, client.WithKey(k))
	if err != nil {
		return e.reportWebhookWrite(c.json, k, err)
	}
	if c.json {
		e.printJSON(webhookResult{OperationKey: k, State: stateCompleted, Replayed: res.Replayed,
			Webhook: rotationView{ID: res.ID, PreviousSecretExpiresAt: res.PreviousSecretExpiresAt}, Secret: res.Secret})
	} else {
		how := "rotated"
		if res.Replayed {
			how = "rotated (replayed: an earlier delivery had executed it)"
		}
		fmt.Fprintf(e.stdout, "%s the secret of webhook endpoint %s; the previous one signs beside it until %s\nsecret: %s\noperation key: %s\n",
			how, res.ID, res.PreviousSecretExpiresAt.UTC().Format(time.RFC3339), res.Secret, k)
	}
	fmt.Fprintln(e.stderr, secretNotice)
	return nil
}

func (e *env) webhooksDelete(ctx context.Context, args []string) error {
	cl, k, id, c, err := e.endpointWrite(args, "delete", "the operation key of this intent (default: a new one)")
	if err != nil {
		return err
	}
	res, err := cl.DeleteWebhook(ctx, id, client.WithKey(k))
	if err != nil {
		return e.reportWebhookWrite(c.json, k, err)
	}
	if c.json {
		e.printJSON(webhookResult{OperationKey: k, State: stateCompleted, Replayed: res.Replayed, Webhook: res.Deletion})
		return nil
	}
	fmt.Fprintf(e.stdout, "deleted webhook endpoint %s at %s\noperation key: %s\n", res.Deletion.ID,
		res.Deletion.DeletedAt.UTC().Format(time.RFC3339), k)
	return nil
}

// reportWebhookWrite prints a webhook write's failure as reportWrite does
// a note's, and returns run's error. A create or rotation that completed
// without its secret reaching quill says how to receive it.
func (e *env) reportWebhookWrite(asJSON bool, key string, err error) error {
	state, obj, code := describeWriteError(err)
	if asJSON {
		e.printJSON(webhookResult{OperationKey: key, State: state, Error: obj})
		return exitError{code: code, err: err}
	}
	fmt.Fprintf(e.stderr, "quill: %s: %v\n", state, err)
	switch {
	case errors.Is(err, client.ErrSecretNotReceived):
		fmt.Fprintf(e.stderr, "quill: operation key %s — it was executed, but its secret has not been received: run \"quill ops resume\" "+
			"(or this command again with --key %s) to have it shown; never a new key, which would make another secret\n", key, key)
	case code == exitUnknown:
		fmt.Fprintf(e.stderr, "quill: operation key %s — run \"quill ops get %s\" or \"quill ops resume\"; do not repeat the write with a new key\n", key, key)
	}
	return exitError{code: code, err: err}
}

func (e *env) webhooksList(ctx context.Context, args []string) error {
	var c common
	s := e.set("quill webhooks list", "quill webhooks list")
	e.define(s, &c, false)
	if err := parseNone(s, args); err != nil {
		return err
	}
	cl, err := e.newClient(c, false)
	if err != nil {
		return err
	}
	hooks, err := cl.ListWebhooks(ctx)
	if err != nil {
		return e.reportRead(c.json, err)
	}
	if c.json {
		e.printJSON(struct {
			Items      []client.Webhook `json:"items"`
			NextCursor *string          `json:"next_cursor"`
		}{Items: hooks})
		return nil
	}
	if len(hooks) == 0 {
		fmt.Fprintln(e.stdout, "no webhook endpoints")
	}
	for _, h := range hooks {
		fmt.Fprintf(e.stdout, "%s  %-8s  %s  %s  %s\n", h.ID, h.State, h.URL, strings.Join(h.EventTypes, ","), healthLine(h.Health))
	}
	return nil
}

// healthLine is an endpoint's health in a few words.
func healthLine(h client.WebhookHealth) string {
	if h.LastAttemptAt == nil {
		return "no delivery attempted"
	}
	last := "no answer"
	if h.LastStatus != nil {
		last = fmt.Sprintf("HTTP %d", *h.LastStatus)
	}
	out := fmt.Sprintf("last attempt %s (%s)", h.LastAttemptAt.UTC().Format(time.RFC3339), last)
	if h.FailuresInRow > 0 {
		out += fmt.Sprintf(", %d failures in a row", h.FailuresInRow)
	}
	return out
}

func (e *env) webhooksGet(ctx context.Context, args []string) error {
	var c common
	const synopsis = "quill webhooks get ID"
	s := e.set("quill webhooks get", synopsis)
	e.define(s, &c, false)
	pos, err := parseOne(s, args, synopsis)
	if err != nil {
		return err
	}
	id, err := webhookID(pos, synopsis)
	if err != nil {
		return err
	}
	cl, err := e.newClient(c, false)
	if err != nil {
		return err
	}
	h, err := cl.GetWebhook(ctx, id)
	if err != nil {
		return e.reportRead(c.json, err)
	}
	if c.json {
		e.printJSON(h)
		return nil
	}
	printWebhook(e.stdout, *h)
	return nil
}

func printWebhook(w io.Writer, h client.Webhook) {
	fmt.Fprintf(w, "id:          %s\nurl:         %s\nevent types: %s\ncreated:     %s\nstate:       %s\n",
		h.ID, h.URL, strings.Join(h.EventTypes, ", "), h.CreatedAt.UTC().Format(time.RFC3339), h.State)
	if h.DisabledReason != "" {
		fmt.Fprintf(w, "disabled:    %s\n", h.DisabledReason)
	}
	if h.Description != "" {
		fmt.Fprintf(w, "description: %s\n", h.Description)
	}
	fmt.Fprintf(w, "health:      %s\n", healthLine(h.Health))
	if d := h.Health.LastDeliveryAt; d != nil {
		fmt.Fprintf(w, "delivered:   %s (last 2xx)\n", d.UTC().Format(time.RFC3339))
	}
	if f := h.Health.FailingSince; f != nil {
		fmt.Fprintf(w, "failing:     since %s\n", f.UTC().Format(time.RFC3339))
	}
	if le := h.Health.LastError; le != nil && *le != "" {
		fmt.Fprintf(w, "last error:  %s\n", *le)
	}
}
