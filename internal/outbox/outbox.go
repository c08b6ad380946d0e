// Package outbox writes Quill's domain events into the transactional outbox,
// inside the caller's transaction, as CloudEvents 1.0 structured JSON with a
// stable event id; the relay publishes them to NATS JetStream later.
package outbox

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/db"
)

// NotifyChannel is the LISTEN/NOTIFY channel a writing transaction signals so
// that relays wake up at its commit.
const NotifyChannel = "quill_outbox"

// Event is one domain event to publish.
type Event struct {
	// ID is the stable event id: the CloudEvents id and the Nats-Msg-Id.
	ID           uuid.UUID
	Tenant       string
	OperationKey string
	// AggregateID is the note the event is about; events of one aggregate
	// are published in commit order.
	AggregateID uuid.UUID
	// Type is the event type, one of contract.EventTypes.
	Type string
	Time time.Time
	// Data is the CloudEvents data member, marshaled as JSON.
	Data any
	// Traceparent and Tracestate are the W3C trace context of the span
	// that wrote the event, the parent of the relay's publish; empty when
	// there is none.
	Traceparent string
	Tracestate  string
}

// CloudEvent is an event as the relay publishes it: CloudEvents 1.0
// structured JSON. Consumers parse Data as the data of the event's type.
type CloudEvent struct {
	SpecVersion     string `json:"specversion"`
	ID              string `json:"id"`
	Source          string `json:"source"`
	Type            string `json:"type"`
	Subject         string `json:"subject"`
	Time            string `json:"time"`
	DataContentType string `json:"datacontenttype"`
	// DataSchema names the JSON Schema of Data (contract.DataSchema). Events
	// written before Quill set it have none.
	DataSchema string         `json:"dataschema,omitempty"`
	Data       jsontext.Value `json:"data"`
}

// TimeFormat is how Quill writes times: RFC 3339, UTC, microseconds (the
// precision PostgreSQL stores).
const TimeFormat = "2006-01-02T15:04:05.000000Z"

// Envelope returns e as CloudEvents 1.0 structured JSON. Data given as a
// jsontext.Value is taken as it is — the note's JSON that the create's
// answer and its record already hold (issue 29: each JSON rendered once) —
// and must be compact; anything else is marshaled deterministically.
//
// The envelope is appended member by member rather than marshaled through
// reflection, byte for byte what marshaling CloudEvent deterministically
// gives (TestEnvelopeIsTheMarshaledCloudEvent).
func Envelope(e Event) ([]byte, error) {
	data, ok := e.Data.(jsontext.Value)
	if !ok {
		var err error
		if data, err = json.Marshal(e.Data, json.Deterministic(true)); err != nil {
			return nil, fmt.Errorf("marshal event data: %w", err)
		}
	}
	names, known := quotedTypes[e.Type]
	if !known {
		var err error
		if names, err = quoteType(e.Type); err != nil {
			return nil, err
		}
	}
	var t [len(TimeFormat)]byte
	when := AppendTime(t[:0], e.Time)
	out := make([]byte, 0, envelopeSize(e.Tenant, names, data))
	out = append(out, `{"specversion":"1.0","id":"`...)
	out = AppendUUID(out, e.ID)
	out = append(out, `","source":`...)
	// contract.Source(e.Tenant) quoted: its prefix needs no escaping, so
	// the tenant is quoted after it, without the opening quote.
	out = append(out, quotedSourcePrefix...)
	at := len(out)
	var err error
	if out, err = jsontext.AppendQuote(out, e.Tenant); err != nil {
		return nil, fmt.Errorf("marshal event source: %w", err)
	}
	out = append(out[:at], out[at+1:]...)
	out = append(out, `,"type":`...)
	out = append(out, names.ceType...)
	out = append(out, `,"subject":"`...)
	out = AppendUUID(out, e.AggregateID)
	out = append(out, `","time":"`...)
	out = append(out, when...)
	out = append(out, `","datacontenttype":"application/json"`...)
	if names.schema != "" {
		out = append(out, `,"dataschema":`...)
		out = append(out, names.schema...)
	}
	out = append(out, `,"data":`...)
	out = append(out, data...)
	return append(out, '}'), nil
}

// envelopeSize is how many bytes Envelope writes for an event of tenant,
// type names and data when the tenant needs no escapes, with room for a
// few: the buffer it makes, so that it is never grown (and a copy of the
// event's data thrown away) on the way.
func envelopeSize(tenant string, names typeNames, data []byte) int {
	// The members' names and punctuation, the two ids and the time are
	// 230 bytes.
	return 240 + len(quotedSourcePrefix) + len(tenant) + len(names.ceType) + len(names.schema) + len(data)
}

// typeNames are an event type's CloudEvents type and data schema, quoted
// as JSON strings.
type typeNames struct{ ceType, schema string }

// quoteType quotes typ's CloudEvents type and data schema.
func quoteType(typ string) (typeNames, error) {
	ce, err := jsontext.AppendQuote(nil, contract.CloudEventType(typ))
	if err != nil {
		return typeNames{}, fmt.Errorf("marshal event type: %w", err)
	}
	var schema []byte
	if s := contract.DataSchema(typ); s != "" {
		if schema, err = jsontext.AppendQuote(nil, s); err != nil {
			return typeNames{}, fmt.Errorf("marshal event schema: %w", err)
		}
	}
	return typeNames{string(ce), string(schema)}, nil
}

// quotedSourcePrefix opens a quoted CloudEvents source, before the tenant.
var quotedSourcePrefix = `"` + contract.Source("")

// quotedTypes are the names of contract.EventTypes, quoted once.
var quotedTypes = func() map[string]typeNames {
	m := map[string]typeNames{}
	for _, typ := range contract.EventTypes() {
		if n, err := quoteType(typ); err == nil {
			m[typ] = n
		}
	}
	return m
}()

// AppendUUID appends u's canonical text form, as u.String() gives it,
// without the string: hex digits and dashes, which need no JSON escaping.
func AppendUUID(dst []byte, u uuid.UUID) []byte {
	at := len(dst)
	dst = append(dst, "00000000-0000-0000-0000-000000000000"...)
	s := dst[at:]
	hex.Encode(s[0:8], u[0:4])
	hex.Encode(s[9:13], u[4:6])
	hex.Encode(s[14:18], u[6:8])
	hex.Encode(s[19:23], u[8:10])
	hex.Encode(s[24:], u[10:])
	return dst
}

// sqlEventInsert writes an event as its own statement.
var sqlEventInsert = EventInsert.Values()

const sqlNotify = `SELECT pg_notify('` + NotifyChannel + `', '')`

// Queue adds the insert of e to b; b must run inside the transaction that
// writes the business effect. It sends no NOTIFY: a transaction that
// notifies takes a database-wide lock at commit and holds it through the WAL
// flush, which serialises every writer's commit. Writers signal a Notifier
// after the commit instead.
func Queue(b *pgx.Batch, e Event) error {
	return queue(b, sqlEventInsert, e)
}

func queue(b *pgx.Batch, sql string, e Event) error {
	args, err := InsertArgs(e)
	if err != nil {
		return err
	}
	b.Queue(sql, args...)
	return nil
}

// EventIDConstraint is the unique constraint on an event's id, named in the
// error of an insert whose id is taken.
const EventIDConstraint = "outbox_events_id_key"

// EventInsert is the outbox row's insert, for a statement that writes an
// event beside other rows (idempotency.ClaimWrite); InsertArgs gives its
// parameters.
var EventInsert = db.Insert{Table: "outbox_events", Columns: []db.Column{
	{Name: "id", Type: "uuid"}, {Name: "tenant", Type: "text"}, {Name: "operation_key", Type: "text", NullIfEmpty: true},
	{Name: "aggregate_id", Type: "uuid"}, {Name: "type", Type: "text"}, {Name: "payload", Type: "bytea"},
	{Name: "traceparent", Type: "text", NullIfEmpty: true}, {Name: "created_at", Type: "timestamptz"},
	{Name: "tracestate", Type: "text", NullIfEmpty: true},
}}

// InsertArgs returns the parameters of e's insert, in EventInsert's order
// (the envelope marshaled). Errors: the data does not marshal.
func InsertArgs(e Event) ([]any, error) { return InsertArgsIn(nil, e) }

// InsertArgsIn is InsertArgs with the parameters kept in a (a
// transaction's db.Args).
func InsertArgsIn(a *db.Args, e Event) ([]any, error) {
	payload, err := Envelope(e)
	if err != nil {
		return nil, err
	}
	return []any{a.UUID(e.ID), a.Text(e.Tenant), a.Text(e.OperationKey), a.UUID(e.AggregateID), a.Text(e.Type), a.Bytes(payload),
		a.Text(e.Traceparent), a.Time(e.Time), a.Text(e.Tracestate)}, nil
}

// pgUUID passes a UUID to pgx in binary; a uuid.UUID would go through its
// string form.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// Execer runs a statement.
type Execer interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Insert writes e into the outbox through tx, the caller's transaction.
func Insert(ctx context.Context, tx Execer, e Event) error {
	var b pgx.Batch
	if err := Queue(&b, e); err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("insert outbox event: %w", err)
	}
	return nil
}

// Notifier wakes the relays after events committed: Signal is cheap and
// never blocks; Run sends one NOTIFY on the channel for any number of
// signals that arrived while the previous one was being sent. A lost
// notification (a crash right after a commit) costs only latency: relays also
// poll.
type Notifier struct {
	db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}
	pending chan struct{}
	log     func(error)
}

// NewNotifier returns a notifier that sends through db (a pool); failures
// go to onError and are otherwise ignored.
func NewNotifier(db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, onError func(error)) *Notifier {
	if onError == nil {
		onError = func(error) {}
	}
	return &Notifier{db: db, pending: make(chan struct{}, 1), log: onError}
}

// notifyTimeout bounds one NOTIFY.
const notifyTimeout = 5 * time.Second

// Signal asks for a NOTIFY after the events just committed.
func (n *Notifier) Signal() {
	if n == nil {
		return
	}
	select {
	case n.pending <- struct{}{}:
	default: // one is pending already and will cover this commit
	}
}

// Run sends the notifications until ctx ends. It returns nil.
func (n *Notifier) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.pending:
			// Bounded: a NOTIFY stuck on a silent connection would hold
			// back every later one (relays would be left to polling).
			nctx, cancel := context.WithTimeout(ctx, notifyTimeout)
			_, err := n.db.Exec(nctx, sqlNotify)
			cancel()
			if err != nil && ctx.Err() == nil {
				n.log(fmt.Errorf("notify relays: %w", err))
			}
		}
	}
}
