package relay

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/outbox"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/tracing"
)

// BenchmarkPublishBatch is the relay's publish path without PostgreSQL: a
// claimed batch of DefaultBatch events, each with a stored traceparent,
// built into messages, published and its acknowledgements awaited, against
// an in-process JetStream server; with tracing off, and on with every span
// sampled and dropped by a no-op exporter. It reports the cost per event.
func BenchmarkPublishBatch(b *testing.B) {
	srv := natstest.Start(b)
	nc, _ := srv.Connect(b, ConnOptions()...)
	b.Run("tracing=off", func(b *testing.B) { benchmarkPublishBatch(b, nc, nil) })
	tracer := tracing.NewWithExporter(tracetest.NewNoopExporter(), "bench").Tracer()
	b.Run("tracing=on", func(b *testing.B) { benchmarkPublishBatch(b, nc, tracer) })
}

func benchmarkPublishBatch(b *testing.B, nc *nats.Conn, tracer trace.Tracer) {
	name := "BENCH_OFF"
	if tracer != nil {
		name = "BENCH_ON"
	}
	cfg := Config{Stream: stream.Config{Name: name, SubjectPrefix: strings.ToLower(name), DuplicateWindow: time.Minute, MaxAge: time.Hour}}
	r, err := newUnpooled(nc, cfg)
	if err != nil {
		b.Fatal(err)
	}
	r.tracer = tracer
	ctx := context.Background()
	if err := r.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	events := make([]outbox.Pending, r.cfg.Batch)
	for i := range events {
		events[i] = outbox.Pending{Seq: int64(i), Tenant: "acme", Type: contract.EventNoteCreated,
			Payload: make([]byte, 400), Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	}
	var n uint64
	b.ReportAllocs()
	for b.Loop() {
		for i := range events {
			n++ // a new event id each time, so the stream stores every message
			binary.BigEndian.PutUint64(events[i].ID[8:], n)
		}
		bt := r.publish(0, events)
		if acks := r.awaitAcks(ctx, bt); len(acks) != len(events) {
			b.Fatalf("%d of %d events acknowledged: %v", len(acks), len(events), bt.failed)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/event")
}

// newUnpooled is a relay with no PostgreSQL, for the publish path alone.
func newUnpooled(nc *nats.Conn, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.AckTimeout), jetstream.WithPublishAsyncMaxPending(2*cfg.Batch))
	if err != nil {
		return nil, err
	}
	return &Relay{nc: nc, js: js, cfg: cfg, log: zerolog.Nop(), m: metrics.NewRelay(prometheus.NewRegistry())}, nil
}
