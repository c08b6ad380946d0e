package consumer_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
)

// A counter of notes per tenant, a cheap effect: the events delivered
// together are counted in one transaction. Should one of them break a
// statement, the batch rolls back and each event is counted alone.
func ExampleNewBatch() {
	ctx := context.Background()
	var (
		pool *pgxpool.Pool       // the service's database, migrated with consumer.Migrate
		js   jetstream.JetStream // Quill's NATS
	)
	c, err := consumer.NewBatch(pool, js, consumer.Config{
		Durable:        "note-counts",
		FilterSubjects: []string{contract.TypeSubjects(contract.DefaultSubjectPrefix, contract.EventNoteCreated)},
		Concurrency:    64, // a batch never holds more deliveries than this
		MaxBatch:       32,
	}, func(ctx context.Context, tx pgx.Tx, events []consumer.Event) error {
		counts := map[string]int{}
		for _, ev := range events { // duplicates already left out
			counts[ev.Tenant]++
		}
		for tenant, n := range counts {
			if _, err := tx.Exec(ctx, `INSERT INTO note_counts (tenant, notes) VALUES ($1, $2)
				ON CONFLICT (tenant) DO UPDATE SET notes = note_counts.notes + $2`, tenant, n); err != nil {
				return err
			}
		}
		return nil // one commit, then every message is acknowledged
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
