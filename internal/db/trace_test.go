package db_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// A pipelined transaction under a recording span is a child span of it,
// from BEGIN to the connection's release, failed when the transaction
// failed; under no span it makes none.
func TestPipelineIsAChildSpanOfTheCaller(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, parent := tp.Tracer("test").Start(t.Context(), "request")

	tx, err := db.BeginPipeline(ctx, pool)
	require.NoError(t, err)
	tx.Batch().Queue("SELECT 1")
	require.NoError(t, tx.Commit(ctx))
	tx.Release()

	tx, err = db.BeginPipeline(ctx, pool)
	require.NoError(t, err)
	tx.Batch().Queue("SELECT 1/0")
	require.Error(t, tx.Commit(ctx))
	tx.Release()
	parent.End()

	tx, err = db.BeginPipeline(t.Context(), pool)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(t.Context()))
	tx.Release()

	spans := exp.GetSpans()
	require.Len(t, spans, 3, "two transactions and their parent; none without a span")
	for _, s := range spans[:2] {
		require.Equal(t, "transaction", s.Name)
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent.SpanID())
		require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext.TraceID())
	}
	require.Equal(t, codes.Unset, spans[0].Status.Code)
	require.Equal(t, codes.Error, spans[1].Status.Code, "the failed transaction")
	require.NotEmpty(t, spans[1].Events, "its error and rollback are recorded")
}

// A group's transaction under a recording span is a child span of it too,
// marked as the group's, failed when the server refused it.
func TestGroupTxIsAChildSpanOfTheCaller(t *testing.T) {
	t.Parallel()
	pool, _ := dbtest.Pool(t, 2)
	g, err := db.NewGroup(pool, db.GroupConfig{}.WithDefaults(2))
	require.NoError(t, err)
	defer g.Close()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, parent := tp.Tracer("test").Start(t.Context(), "request")
	require.NoError(t, g.Do(ctx, &db.GroupTx{Stmts: []db.GroupStmt{{SQL: "SELECT 1"}}}))
	require.Error(t, g.Do(ctx, &db.GroupTx{Stmts: []db.GroupStmt{{SQL: "SELECT 1/0"}}}))
	parent.End()
	require.NoError(t, g.Do(t.Context(), &db.GroupTx{Stmts: []db.GroupStmt{{SQL: "SELECT 1"}}}))

	spans := exp.GetSpans()
	require.Len(t, spans, 3, "two transactions and their parent; none without a span")
	for _, s := range spans[:2] {
		require.Equal(t, "transaction", s.Name)
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent.SpanID())
	}
	require.Equal(t, codes.Unset, spans[0].Status.Code)
	require.Equal(t, codes.Error, spans[1].Status.Code, "the refused transaction")
}
