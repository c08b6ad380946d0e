package consumer_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
)

// A search service keeps its own table of note titles: each note.created
// event inserts a row, each note.deleted event removes it, once per event,
// in the service's own database.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://search@127.0.0.1:5432/search")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := consumer.Migrate(ctx, pool); err != nil { // the inbox and dead-letter tables
		log.Fatal(err)
	}
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(pool, js, consumer.Config{
		Durable: "search-index",
		FilterSubjects: []string{
			contract.TypeSubjects(contract.DefaultSubjectPrefix, contract.EventNoteCreated),
			contract.TypeSubjects(contract.DefaultSubjectPrefix, contract.EventNoteDeleted),
		},
		OrderBySubject: true, // a note's delete never overtakes its create in this process
		Registerer:     prometheus.NewRegistry(),
	}, func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error {
		switch ev.Type {
		case contract.CloudEventType(contract.EventNoteCreated):
			var note struct {
				ID    string `json:"id"`
				Title string `json:"title"`
			}
			if err := json.Unmarshal(ev.Data, &note, json.RejectUnknownMembers(false)); err != nil {
				return consumer.Permanent(err) // no redelivery will parse it
			}
			_, err := tx.Exec(ctx, `INSERT INTO search_notes (tenant, id, title) VALUES ($1, $2, $3)
				ON CONFLICT (tenant, id) DO NOTHING`, ev.Tenant, note.ID, note.Title)
			return err
		case contract.CloudEventType(contract.EventNoteDeleted):
			_, err := tx.Exec(ctx, `DELETE FROM search_notes WHERE tenant = $1 AND id = $2`, ev.Tenant, ev.Subject)
			return err
		}
		return nil // a type this service does not use: recorded in the inbox, acknowledged
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGTERM; then in-flight handlers finish
		log.Fatal(err)
	}
}
