package client_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/quillhq/quill/client"
)

// One user intent is one operation key: hold it (here in a journal) and
// reuse it for every retry; an unknown outcome is looked up, never
// re-planned under a new key.
func Example() {
	j, err := client.OpenFileJournal("/var/lib/my-agent/quill-journal")
	if err != nil {
		panic(err)
	}
	c, err := client.New(client.Config{BaseURL: "http://127.0.0.1:8080", Token: "qt_…", Journal: j})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	key := c.NewKey() // the key of the user's "save this note"
	res, err := c.CreateNote(ctx, client.NewNote{Title: "Groceries"}, client.WithKey(key))
	var unknown *client.UnknownOutcomeError
	var refused *client.RefusedError
	switch {
	case err == nil:
		fmt.Println("note", res.Note.ID, "replayed:", res.Replayed)
	case errors.As(err, &unknown):
		// Later, or after a restart: c.Resume(ctx), or c.GetOperation(ctx, unknown.Key).
		fmt.Println("outcome unknown; keep key", unknown.Key)
	case errors.As(err, &refused):
		fmt.Println("refused:", refused.Problem.Code)
	}
}

// A webhook endpoint's secret is in the create's answer only: keep it
// where the receiver can read it. A create whose answer was lost is
// finished under the same key, which replays the same secret.
func ExampleClient_CreateWebhook() {
	c, err := client.New(client.Config{BaseURL: "http://127.0.0.1:8080", Token: "qt_…"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	key := c.NewKey()
	res, err := c.CreateWebhook(ctx, client.NewWebhook{
		URL:        "https://hooks.example.com/quill",
		EventTypes: []string{"quill.note.created.v1", "quill.note.deleted.v1"},
	}, client.WithKey(key))
	switch {
	case errors.Is(err, client.ErrSecretNotReceived):
		// Created, but the secret did not arrive: send it again with key.
		fmt.Println("resend with key", key)
	case err != nil:
		fmt.Println("not created:", err)
	default:
		fmt.Println("endpoint", res.Webhook.ID) // and store res.Secret for the receiver
	}
	hooks, err := c.ListWebhooks(ctx)
	if err == nil {
		for _, h := range hooks {
			fmt.Println(h.ID, h.State, h.Health.FailuresInRow)
		}
	}
}
