package consumer

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/quillhq/quill/contract"
)

// Event is one of Quill's events as a handler receives it: the CloudEvent's
// attributes (SPEC §5), checked to be of Quill's form, and where the
// message came from.
type Event struct {
	// ID is the stable event id, a UUID in its canonical lower-case form:
	// the key of the inbox.
	ID string
	// Type is the CloudEvents type, e.g. quill.note.created.v1.
	Type string
	// Source is /tenants/<tenant>.
	Source string
	// Tenant is the tenant named by Source.
	Tenant string
	// Subject is the CloudEvents subject: the note id.
	Subject string
	// Time is the CloudEvents time: the writer's clock when it planned the
	// transaction that wrote the event.
	Time time.Time
	// DataContentType is the CloudEvents datacontenttype
	// (application/json).
	DataContentType string
	// DataSchema is the CloudEvents dataschema, "" when the event names
	// none.
	DataSchema string
	// Data is the CloudEvents data member, raw JSON: unmarshal it into the
	// type's payload.
	Data []byte
	// Payload is the message's data, the CloudEvent exactly as the stream
	// carried it: for a consumer that passes the event on (a webhook's
	// body, whose signature covers these bytes).
	Payload []byte
	// Delivery says how the message reached the consumer.
	Delivery Delivery
}

// Delivery is the JetStream side of a message.
type Delivery struct {
	// Subject is the NATS subject, <prefix>.<tenant>.<aggregate>.<event>.
	Subject string
	// StreamSeq is the message's stream sequence.
	StreamSeq uint64
	// Deliveries is how often it has been delivered, this delivery
	// included (NumDelivered).
	Deliveries int
	// Timestamp is when the stream stored it.
	Timestamp time.Time
	// Header is the message's NATS headers (Nats-Msg-Id, traceparent, …).
	Header nats.Header
}

// cloudEvent is the structured JSON of a CloudEvent as Quill writes it.
type cloudEvent struct {
	SpecVersion     string         `json:"specversion"`
	ID              string         `json:"id"`
	Source          string         `json:"source"`
	Type            string         `json:"type"`
	Subject         string         `json:"subject"`
	Time            string         `json:"time"`
	DataContentType string         `json:"datacontenttype"`
	DataSchema      string         `json:"dataschema"`
	Data            jsontext.Value `json:"data"`
}

// typeRE is a Quill CloudEvents type: quill.<aggregate>.<event>.v<N>.
var typeRE = regexp.MustCompile(`^quill\.([a-z][a-z_]*)\.([a-z][a-z_]*)\.v[1-9][0-9]*$`)

// InvalidEventError is why a message is not an event of Quill's form (or
// why the configured validator refused it). The message becomes a dead
// letter at once with Reason: no redelivery can cure it.
type InvalidEventError struct {
	Reason string
}

func (e *InvalidEventError) Error() string { return e.Reason }

// ParseEvent parses payload, a message delivered on the NATS subject
// natsSubject, as a CloudEvents 1.0 structured JSON event of Quill's form:
// specversion 1.0; a UUID id; a source /tenants/<tenant> naming a valid
// tenant; a type quill.<aggregate>.<event>.v<N>; a subject; an RFC 3339
// time; a JSON data member. When natsSubject is not empty it must be
// <prefix>.<tenant>.<aggregate>.<event> of the same tenant, aggregate and
// event, so that no tenant's event is handled under another's name. The
// returned Event has no Delivery. The error is an *InvalidEventError.
func ParseEvent(payload []byte, natsSubject string) (Event, error) {
	var ce cloudEvent
	if err := json.Unmarshal(payload, &ce, json.RejectUnknownMembers(false)); err != nil {
		return Event{}, invalid("unparseable event: %v", err)
	}
	var ev Event
	switch {
	case ce.SpecVersion != "1.0":
		return ev, invalid("event specversion %q is not 1.0", ce.SpecVersion)
	case ce.ID == "":
		return ev, invalid("event has no id")
	case ce.Source == "":
		return ev, invalid("event has no source")
	case ce.Type == "":
		return ev, invalid("event has no type")
	case ce.Subject == "":
		return ev, invalid("event has no subject")
	case ce.Time == "":
		return ev, invalid("event has no time")
	case len(ce.Data) == 0:
		return ev, invalid("event has no data")
	}
	id, err := uuid.Parse(ce.ID)
	if err != nil || len(ce.ID) != 36 {
		return ev, invalid("event id %q is not a UUID", ce.ID)
	}
	tenant, ok := contract.SourceTenant(ce.Source)
	switch {
	case !ok || tenant == "":
		return ev, invalid("event source %q is not /tenants/<tenant>", ce.Source)
	case !contract.ValidTenant(tenant):
		return ev, invalid("event source %q is not /tenants/<tenant>: it names tenant %q, which is not a valid tenant name", ce.Source, truncate(tenant, 80))
	}
	m := typeRE.FindStringSubmatch(ce.Type)
	if m == nil {
		return ev, invalid("event type %q is not quill.<aggregate>.<event>.v<N>", ce.Type)
	}
	t, err := time.Parse(time.RFC3339Nano, ce.Time)
	if err != nil {
		return ev, invalid("event time %q is not RFC 3339", ce.Time)
	}
	if natsSubject != "" {
		tok := strings.Split(natsSubject, ".")
		if len(tok) == 4 && tok[1] != tenant {
			// The subject is what the stream's per-tenant limits and
			// filters saw: the event must be that tenant's.
			return ev, invalid("event of tenant %q and type %q delivered on subject %q, whose tenant is %q",
				tenant, ce.Type, truncate(natsSubject, 200), tok[1])
		}
		if len(tok) != 4 || tok[2] != m[1] || tok[3] != m[2] {
			return ev, invalid("event of tenant %q and type %q delivered on subject %q, which is not <prefix>.%s.%s.%s",
				tenant, ce.Type, natsSubject, tenant, m[1], m[2])
		}
	}
	return Event{
		ID:              id.String(),
		Type:            ce.Type,
		Source:          ce.Source,
		Tenant:          tenant,
		Subject:         ce.Subject,
		Time:            t,
		DataContentType: ce.DataContentType,
		DataSchema:      ce.DataSchema,
		Data:            []byte(ce.Data),
		Payload:         payload,
	}, nil
}

// truncate cuts s to at most n bytes, for quoting a hostile value.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func invalid(format string, args ...any) error {
	return &InvalidEventError{Reason: fmt.Sprintf(format, args...)}
}

// permanentError marks a handler's error that no redelivery can cure.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that the consumer records the message as a dead
// letter at once, instead of redelivering it: for an event the handler can
// never apply (its data refers to what cannot exist). The transaction is
// rolled back all the same. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err is, or wraps, an error made by Permanent
// or an *InvalidEventError.
func IsPermanent(err error) bool {
	var p *permanentError
	var inv *InvalidEventError
	return errors.As(err, &p) || errors.As(err, &inv)
}

// TraceID returns the W3C trace id of the message's traceparent header
// (the relay's publish span), or "" when it has none that parses.
func (e Event) TraceID() string {
	tp := e.Delivery.Header.Get("traceparent")
	// version "-" trace-id(32 hex) "-" parent-id(16 hex) "-" flags(2 hex)
	if len(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' {
		return ""
	}
	id := tp[3:35]
	if strings.Trim(id, "0") == "" || strings.Trim(id, "0123456789abcdef") != "" {
		return ""
	}
	return id
}

// logAttrs are the attributes of a log line about e: its id and, when the
// message carries one, its trace id.
func (e Event) logAttrs(attrs ...any) []any {
	out := append([]any{"event_id", e.ID}, attrs...)
	if id := e.TraceID(); id != "" {
		out = append(out, "trace_id", id)
	}
	return out
}

// noteTypes are the CloudEvents types whose data carries the note's
// version (SPEC §5): created, updated and deleted, of the release this
// package was built with. A later version of a type (quill.note.updated.v2)
// is not among them: during a migration Quill writes both for one change,
// with one version, and a guard that applied the one the handler ignores
// would skip the other as stale.
var noteTypes = map[string]bool{
	contract.CloudEventType(contract.EventNoteCreated): true,
	contract.CloudEventType(contract.EventNoteUpdated): true,
	contract.CloudEventType(contract.EventNoteDeleted): true,
}

// Version returns the note's version after the change a note event
// reports — its data.version: 1 for quill.note.created.v1, the new
// version for quill.note.updated.v1, the last version plus one for
// quill.note.deleted.v1 — and true. It returns 0 and false for an event
// that carries none: of another type (attachment.processed, a type this
// build does not know), written before Quill versioned notes, or whose
// version is not a positive integer in canonical decimal form (which
// Config.Versions makes a dead letter).
func (e Event) Version() (int64, bool) {
	v, err := e.version()
	return v, err == nil && v > 0
}

// version returns e's data.version: 0 and nil when e is not a note event
// or its data has no version member, an error when the member is not a
// positive integer (or the data not a JSON object) — no redelivery cures
// either.
func (e Event) version() (int64, error) {
	if !noteTypes[e.Type] {
		return 0, nil
	}
	var d struct {
		Version jsontext.Value `json:"version"`
	}
	if err := json.Unmarshal(e.Data, &d, json.RejectUnknownMembers(false)); err != nil {
		return 0, fmt.Errorf("data is not a JSON object: %v", err)
	}
	if len(d.Version) == 0 {
		return 0, nil
	}
	raw := string(d.Version)
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v < 1 || raw[0] == '+' || raw[0] == '0' {
		return 0, fmt.Errorf("data.version %s is not a positive integer", truncate(raw, 40))
	}
	return v, nil
}
