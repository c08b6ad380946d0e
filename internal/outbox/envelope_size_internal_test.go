package outbox

import (
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/uuid"

	"github.com/quillhq/quill/contract"
)

// Every event type's envelope fits the buffer Envelope makes for it, at
// short and long tenants and data.
func TestEnvelopeSize(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 16, 0, 0, 123456789, time.UTC)
	for _, typ := range contract.EventTypes() {
		for _, tenant := range []string{"a", "acme", strings.Repeat("t", 64)} {
			for _, data := range []jsontext.Value{jsontext.Value(`{}`), jsontext.Value(`{"id":"` + strings.Repeat("x", 4000) + `"}`)} {
				e := Event{ID: uuid.New(), Tenant: tenant, AggregateID: uuid.New(), Type: typ, Time: at, Data: data}
				got, err := Envelope(e)
				if err != nil {
					t.Fatal(err)
				}
				if n := envelopeSize(tenant, quotedTypes[typ], data); len(got) > n {
					t.Errorf("%s of %q: %d bytes over the %d made for them", typ, tenant, len(got), n)
				}
			}
		}
	}
}
