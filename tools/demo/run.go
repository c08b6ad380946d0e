package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
)

const synopsis = `demo [flags]

The article's story against a running Quill (start it with make dev): a
create-note whose response is lost after the commit, the retry under the same
operation key, the lookup that explains the final state, a changed request
under the old key (refused) and the same request under a new key (a second
note). Exit status 0 when everything behaved as promised, 1 when not.`

type settings struct {
	url, token string
	wait       time.Duration
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var s settings
	set := config.New("demo", synopsis, getenv, stderr)
	set.String(&s.url, "url", "QUILL_URL", "http://127.0.0.1:8080", "the API's base URL")
	set.String(&s.token, "token", "QUILL_TOKEN", "", "a bearer token (api token create --tenant demo)")
	set.Duration(&s.wait, "wait", "QUILL_DEMO_WAIT", 30*time.Second, "how long to wait for the event and the attachment to settle")
	if err := cli.Parse(set, args); err != nil {
		return err
	}
	if s.token == "" {
		return cli.UsageError{Msg: "no token: set QUILL_TOKEN or --token (api token create --tenant demo prints one)"}
	}
	api, err := url.Parse(s.url)
	if err != nil || (api.Scheme != "http" && api.Scheme != "https") || api.Host == "" {
		return cli.UsageError{Msg: fmt.Sprintf("invalid QUILL_URL %q: want http://host:port", s.url)}
	}

	proxy, err := startProxy(api)
	if err != nil {
		return fmt.Errorf("start the fault-injecting proxy: %w", err)
	}
	defer proxy.Close()

	d := &demo{
		api:     strings.TrimRight(s.url, "/"),
		proxy:   proxy.URL(),
		drop:    proxy.DropNext,
		token:   s.token,
		http:    &http.Client{Timeout: 15 * time.Second},
		out:     stdout,
		wait:    s.wait,
		suffix:  randomSuffix(),
		started: time.Now(),
	}
	return d.story(ctx)
}

// demo is one telling of the story.
type demo struct {
	api, proxy string
	drop       func(n int)
	token      string
	http       *http.Client
	out        io.Writer
	wait       time.Duration
	suffix     string
	started    time.Time
}

// failed is a step that did not behave as promised: exit status 1.
type failed struct{ step, msg string }

func (f failed) Error() string { return fmt.Sprintf("step %s: %s", f.step, f.msg) }

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) decode(v any) error { return json.Unmarshal(r.body, v) }

type note struct {
	ID        string `json:"id"`
	Title     string `json:"title"`
	CreatedAt string `json:"created_at"`
}

type attachmentDetail struct {
	Filename    string          `json:"filename"`
	ContentType string          `json:"content_type"`
	Size        int             `json:"size"`
	Status      string          `json:"status"`
	Result      json.RawMessage `json:"result"`
	Reason      string          `json:"reason"`
}

type operation struct {
	Key         string   `json:"key"`
	Action      string   `json:"action"`
	State       string   `json:"state"`
	CompletedAt string   `json:"completed_at"`
	Effects     []effect `json:"effects"`
}

type effect struct {
	Kind        string `json:"kind"`
	ID          string `json:"id"`
	Type        string `json:"type"`
	State       string `json:"state"`
	PublishedAt string `json:"published_at"`
	StreamSeq   *int64 `json:"stream_seq"`
	ProcessedAt string `json:"processed_at"`
}

func (d *demo) story(ctx context.Context) error {
	key := "demo-" + d.suffix + "-1"
	title := "Quarterly plan " + d.suffix
	png, err := demoPNG()
	if err != nil {
		return err
	}
	create := map[string]any{
		"title": title,
		"body":  "Written by an agent on a bad network.",
		"attachment": map[string]any{
			"filename":     "plan.png",
			"content_type": "image/png",
			"data":         base64.StdEncoding.EncodeToString(png),
		},
	}

	d.say("Quill demo — the agent's story (API %s, through a fault-injecting proxy at %s)\n", d.api, d.proxy)
	// The API must answer before the story starts: otherwise step 1's
	// expected failure would be a refused connection, not a lost response.
	if r, err := d.send(ctx, d.api, http.MethodGet, contract.NotesPath+"?limit=1", "", nil); err != nil {
		return fmt.Errorf("the API does not answer (start it with make dev): %w", err)
	} else if r.status != http.StatusOK {
		return fmt.Errorf("GET /v1/notes answered %d: %s", r.status, r.body)
	}

	d.say("\n1. The agent creates a note: POST /v1/notes, Idempotency-Key: %s\n", key)
	d.drop(1)
	r, err := d.send(ctx, d.proxy, http.MethodPost, contract.NotesPath, key, create)
	if err == nil {
		return failed{"1", fmt.Sprintf("the proxy was told to drop the response, yet the agent got %d", r.status)}
	}
	d.say("   The API committed, but the response was lost on the way back: %v\n", err)
	d.say("   The agent cannot tell whether the note exists. It retries with the SAME key.\n")

	d.say("\n2. The agent retries: the same request, Idempotency-Key: %s\n", key)
	r, err = d.send(ctx, d.proxy, http.MethodPost, contract.NotesPath, key, create)
	if err != nil {
		return failed{"2", fmt.Sprintf("the retry failed: %v", err)}
	}
	var first note
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		return failed{"2", fmt.Sprintf("want 201 with Idempotent-Replayed: true (the first attempt committed), got %d %q: %s",
			r.status, r.header.Get("Idempotent-Replayed"), r.body)}
	}
	if err := r.decode(&first); err != nil || first.ID == "" {
		return failed{"2", fmt.Sprintf("the replayed body is not a note: %s", r.body)}
	}
	d.say("   201 Created, Idempotent-Replayed: true — the recorded response of the first attempt.\n")
	d.say("   Note %s, Location %s. Nothing was executed twice.\n", first.ID, r.header.Get("Location"))

	d.say("\n3. The agent looks the key up: GET /v1/operations/%s\n", key)
	op, err := d.settle(ctx, key)
	if err != nil {
		return err
	}
	if err := d.explain(ctx, op, first.ID, title); err != nil {
		return err
	}

	changed := map[string]any{"title": title + " (edited)", "body": create["body"], "attachment": create["attachment"]}
	d.say("\n4. A changed request under the old key (title edited, Idempotency-Key: %s)\n", key)
	r, err = d.send(ctx, d.api, http.MethodPost, contract.NotesPath, key, changed)
	if err != nil {
		return failed{"4", err.Error()}
	}
	var prob struct {
		Code   string   `json:"code"`
		Retry  string   `json:"retry"`
		Fields []string `json:"fields"`
		Detail string   `json:"detail"`
	}
	_ = r.decode(&prob)
	if r.status != http.StatusUnprocessableEntity || prob.Code != contract.CodeKeyReused {
		return failed{"4", fmt.Sprintf("want 422 idempotency_key_reused, got %d: %s", r.status, r.body)}
	}
	d.say("   422 %s, fields %v, retry %q: the key belongs to the first request.\n", prob.Code, prob.Fields, prob.Retry)
	d.say("   A new intent needs a new key; nothing was written.\n")

	key2 := "demo-" + d.suffix + "-2"
	d.say("\n5. The same title under a NEW key (%s): a second, legitimate note\n", key2)
	r, err = d.send(ctx, d.api, http.MethodPost, contract.NotesPath, key2, map[string]any{"title": title})
	if err != nil {
		return failed{"5", err.Error()}
	}
	var second note
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") == "true" || r.decode(&second) != nil || second.ID == first.ID {
		return failed{"5", fmt.Sprintf("want a fresh 201 with a new note, got %d %s", r.status, r.body)}
	}
	d.say("   201 Created, note %s: equal content under a new key is a new operation.\n", second.ID)
	n, err := d.countTitled(ctx, title)
	if err != nil {
		return err
	}
	if n != 2 {
		return failed{"5", fmt.Sprintf("want 2 notes titled %q, found %d", title, n)}
	}
	d.say("   Notes titled %q now: %d — one per operation key, never one per request.\n", title, n)
	d.say("\nEvery step behaved as promised.\n")
	return nil
}

// settle polls the lookup until the operation is completed, every event
// published and the attachment processed or failed, or until d.wait.
func (d *demo) settle(ctx context.Context, key string) (operation, error) {
	deadline := time.Now().Add(d.wait)
	for {
		r, err := d.send(ctx, d.api, http.MethodGet, "/v1/operations/"+url.PathEscape(key), "", nil)
		if err != nil {
			return operation{}, failed{"3", err.Error()}
		}
		if r.status != http.StatusOK {
			return operation{}, failed{"3", fmt.Sprintf("lookup answered %d: %s", r.status, r.body)}
		}
		var op operation
		if err := r.decode(&op); err != nil {
			return operation{}, failed{"3", fmt.Sprintf("lookup body: %v", err)}
		}
		if settled(op) {
			return op, nil
		}
		if time.Now().After(deadline) {
			return op, failed{"3", fmt.Sprintf("not settled after %s (is the relay and the attachment worker running? make dev runs them): %s", d.wait, r.body)}
		}
		select {
		case <-ctx.Done():
			return op, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func settled(op operation) bool {
	if op.State != contract.OperationCompleted {
		return false
	}
	for _, e := range op.Effects {
		switch {
		case e.Kind == "event" && e.State != "published":
			return false
		case e.Kind == "attachment" && e.State == "pending":
			return false
		}
	}
	return true
}

// explain prints the operation's chain and checks it is the one promised.
func (d *demo) explain(ctx context.Context, op operation, noteID, title string) error {
	d.say("   state %s (completed %s), action %s\n", op.State, op.CompletedAt, op.Action)
	var created, attachments int
	for _, e := range op.Effects {
		switch e.Kind {
		case "event":
			seq := "?"
			if e.StreamSeq != nil {
				seq = fmt.Sprint(*e.StreamSeq)
			}
			d.say("   - event %s %s: %s at %s, stream sequence %s\n", e.Type, e.ID, e.State, e.PublishedAt, seq)
			if e.Type == contract.CloudEventType(contract.EventNoteCreated) {
				created++
			}
		case "attachment":
			d.say("   - attachment %s: %s at %s\n", e.ID, e.State, e.ProcessedAt)
			attachments++
			if e.State != "processed" {
				return failed{"3", fmt.Sprintf("attachment %s is %s, want processed", e.ID, e.State)}
			}
		default:
			d.say("   - %s %s: %s\n", e.Kind, e.ID, e.State)
		}
	}
	if created != 1 || attachments != 1 {
		return failed{"3", fmt.Sprintf("want one note.created event and one attachment, the lookup shows %d and %d", created, attachments)}
	}
	r, err := d.send(ctx, d.api, http.MethodGet, contract.NotePath(noteID), "", nil)
	if err != nil {
		return failed{"3", err.Error()}
	}
	var n note
	if r.status != http.StatusOK || r.decode(&n) != nil {
		return failed{"3", fmt.Sprintf("GET /v1/notes/%s answered %d: %s", noteID, r.status, r.body)}
	}
	r, err = d.send(ctx, d.api, http.MethodGet, contract.NotePath(noteID)+"/attachment", "", nil)
	if err != nil {
		return failed{"3", err.Error()}
	}
	var a attachmentDetail
	if r.status != http.StatusOK || r.decode(&a) != nil {
		return failed{"3", fmt.Sprintf("GET /v1/notes/%s/attachment answered %d: %s", noteID, r.status, r.body)}
	}
	d.say("   - GET /v1/notes/%s/attachment: %s (%s, %d bytes) %s, result %s\n",
		n.ID, a.Filename, a.ContentType, a.Size, a.Status, a.Result)
	count, err := d.countTitled(ctx, title)
	if err != nil {
		return err
	}
	if count != 1 {
		return failed{"3", fmt.Sprintf("want exactly one note titled %q, found %d", title, count)}
	}
	d.say("   Explained final state: one note, one note.created event in the stream, its attachment processed.\n")
	return nil
}

// countTitled counts the tenant's live notes with title created since the
// demo started, walking the pages newest first.
func (d *demo) countTitled(ctx context.Context, title string) (int, error) {
	n, cursor := 0, ""
	for range 1000 {
		path := contract.NotesPath + "?limit=100"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		r, err := d.send(ctx, d.api, http.MethodGet, path, "", nil)
		if err != nil {
			return 0, err
		}
		var page struct {
			Items      []note  `json:"items"`
			NextCursor *string `json:"next_cursor"`
		}
		if r.status != http.StatusOK || r.decode(&page) != nil {
			return 0, fmt.Errorf("GET /v1/notes answered %d: %s", r.status, r.body)
		}
		for _, x := range page.Items {
			if x.Title == title {
				n++
			}
			// Newest first: the demo's notes are all younger than its start.
			if t, err := time.Parse(time.RFC3339Nano, x.CreatedAt); err == nil && t.Before(d.started.Add(-time.Minute)) {
				return n, nil
			}
		}
		if page.NextCursor == nil {
			return n, nil
		}
		cursor = *page.NextCursor
	}
	return n, errors.New("GET /v1/notes: more than 1000 pages")
}

func (d *demo) send(ctx context.Context, base, method, path, key string, body any) (reply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{}, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return reply{}, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return reply{}, errors.New("401 unauthenticated: the token is unknown or revoked (api token create --tenant demo)")
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func (d *demo) say(format string, a ...any) { fmt.Fprintf(d.out, format, a...) }

// demoPNG draws a 640×400 gradient: big enough that the worker makes a
// 256-pixel thumbnail of it.
func demoPNG() ([]byte, error) {
	img := image.NewNRGBA(image.Rect(0, 0, 640, 400))
	for y := range 400 {
		for x := range 640 {
			img.Set(x, y, color.NRGBA{R: uint8(x * 255 / 639), G: uint8(y * 255 / 399), B: 160, A: 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("encode the demo PNG: %w", err)
	}
	return buf.Bytes(), nil
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}
