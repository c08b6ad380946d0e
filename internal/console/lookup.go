package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/db"
)

// Lookup kinds: what the operator typed beside the tenant.
const (
	byKey   = "key"
	byNote  = "note"
	byEvent = "event"
)

// lookupForm is the lookup's form, echoed back.
type lookupForm struct {
	Tenant, By, Q string
}

// lookupView is the lookup page's data.
type lookupView struct {
	Form lookupForm
	// NotFound: nothing of the tenant answers to the form (said the same
	// way whether or not it exists for another tenant).
	NotFound bool
	// Invalid is why the form could not be looked up at all.
	Invalid string
	Chain   *audit.Chain
	// Anomalies are the audit's findings on the chain, with their details.
	Anomalies []audit.Anomaly
	// Notes are the audit's remarks (the stream not checked, and why).
	Notes []string
	// Requests is the chain's requests: its execution and its replays.
	Requests    int64
	StreamName  string
	Checked     bool
	Thumbnail   string // URL of the thumbnail, when there is one
	ResolvedVia string // how a note or event id led to the key
}

// The note and event lookups find their operation key in the tenant's
// rows only, so that another tenant's id is not found — the same answer as
// an id that does not exist. A note's create operation names it as its
// resource; an event names its key, or (the worker's attachment.processed)
// its note.
const (
	sqlKeyOfNote = `SELECT key FROM operations
	WHERE tenant = $1 AND resource = $2 AND action = 'create-note' LIMIT 1`
	sqlKeyOfEvent = `SELECT coalesce(operation_key, ''), aggregate_id FROM outbox_events WHERE tenant = $1 AND id = $2`
	sqlThumbnail  = `SELECT a.thumbnail FROM attachments a WHERE a.tenant = $1 AND a.note_id = $2 AND a.thumbnail IS NOT NULL`
)

func (c *Console) lookup(w http.ResponseWriter, r *http.Request) {
	s, _ := sessionOf(r)
	q := r.URL.Query()
	f := lookupForm{Tenant: strings.TrimSpace(q.Get("tenant")), By: q.Get("by"), Q: strings.TrimSpace(q.Get("q"))}
	if f.By == "" {
		f.By = byKey
	}
	v := lookupView{Form: f, StreamName: c.cfg.Audit.Stream.Name}
	if f.Tenant == "" && f.Q == "" {
		c.render(w, r, http.StatusOK, "lookup", page{Title: "Look up an operation", Nav: "lookup", Data: v})
		return
	}
	if msg := f.invalid(); msg != "" {
		v.Invalid = msg
		c.render(w, r, http.StatusBadRequest, "lookup", page{Title: "Look up an operation", Nav: "lookup", Data: v})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	c.actionLog(s, "lookup").
		Str("tenant", f.Tenant).Str("by", f.By).Msg("console: lookup")
	key, via, err := c.resolve(ctx, f)
	if err != nil {
		c.failErr(w, r, "look the operation up", err)
		return
	}
	if key == "" {
		v.NotFound = true
		c.render(w, r, http.StatusNotFound, "lookup", page{Title: "Not found", Nav: "lookup", Data: v})
		return
	}
	cfg := c.cfg.Audit
	cfg.Tenant, cfg.Key = f.Tenant, key
	js, notChecked := c.js(), "NATS is not connected to the API (NATS_URL)"
	var rep *audit.Report
	if js != nil {
		rep, err = audit.Run(ctx, c.pool, js, "", cfg)
	} else {
		rep, err = audit.Run(ctx, c.pool, nil, notChecked, cfg)
	}
	if err != nil {
		c.failErr(w, r, "look the operation up", err)
		return
	}
	if !rep.Scope.Found || len(rep.Chains) == 0 {
		v.NotFound = true
		c.render(w, r, http.StatusNotFound, "lookup", page{Title: "Not found", Nav: "lookup", Data: v})
		return
	}
	ch := rep.Chains[0]
	v.Chain, v.Notes, v.Checked, v.ResolvedVia = &ch, rep.Notes, rep.Stream.Checked, via
	v.Requests = ch.Replays
	if ch.State != "missing" {
		v.Requests++
	}
	for _, x := range rep.Anomalies {
		if x.Tenant == f.Tenant && x.Key == key {
			v.Anomalies = append(v.Anomalies, x)
		}
	}
	if ch.Attachment != nil && ch.Attachment.Status == "processed" && len(ch.Notes) > 0 {
		v.Thumbnail = fmt.Sprintf("%sthumbnail?tenant=%s&note=%s", Prefix, f.Tenant, ch.Notes[0].ID)
	}
	c.render(w, r, http.StatusOK, "lookup", page{Title: "Operation " + key, Nav: "lookup", Data: v})
}

// invalid says what is wrong with the form, or "".
func (f lookupForm) invalid() string {
	if !contract.ValidTenant(f.Tenant) {
		return "The tenant is 1–63 characters of a-z, 0-9 and '-', starting with a letter or digit."
	}
	switch f.By {
	case byKey:
		if _, err := opkey.Parse(f.Q); err != nil {
			return "That is not an operation key: " + strings.TrimPrefix(err.Error(), opkey.ErrInvalid.Error()+": ") + "."
		}
	case byNote, byEvent:
		if _, err := uuid.Parse(f.Q); err != nil || len(f.Q) != 36 {
			return "A " + f.By + " id is a UUID such as 0190f8c2-3b4a-7c8d-9e0f-1a2b3c4d5e6f."
		}
	default:
		return "Look up by key, note id or event id."
	}
	return ""
}

// resolve returns the operation key that the form names within its tenant,
// and how it was found; "" when the tenant has nothing by that name.
func (c *Console) resolve(ctx context.Context, f lookupForm) (key, via string, err error) {
	switch f.By {
	case byKey:
		k, _ := opkey.Parse(f.Q)
		return k, "", nil
	case byNote:
		id := uuid.MustParse(f.Q)
		return c.keyOfNote(ctx, f.Tenant, id, "note "+id.String())
	default:
		id := uuid.MustParse(f.Q)
		var nk string
		var note uuid.UUID
		err := c.pool.QueryRow(ctx, sqlKeyOfEvent, f.Tenant, id).Scan(&nk, &note)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", "", nil
		}
		if err != nil {
			return "", "", fmt.Errorf("event %s: %w", id, db.Translate(err))
		}
		if nk != "" {
			return nk, "event " + id.String(), nil
		}
		return c.keyOfNote(ctx, f.Tenant, note, "event "+id.String()+" of note "+note.String())
	}
}

func (c *Console) keyOfNote(ctx context.Context, tenant string, note uuid.UUID, via string) (string, string, error) {
	var key string
	err := c.pool.QueryRow(ctx, sqlKeyOfNote, tenant, contract.NotePath(note.String())).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("note %s: %w", note, db.Translate(err))
	}
	return key, via, nil
}

// thumbnail serves the thumbnail of a tenant's note's processed attachment.
func (c *Console) thumbnail(w http.ResponseWriter, r *http.Request) {
	tenant, note := r.URL.Query().Get("tenant"), r.URL.Query().Get("note")
	id, err := uuid.Parse(note)
	if !contract.ValidTenant(tenant) || err != nil {
		c.fail(w, r, http.StatusNotFound, "Not found.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	var png []byte
	err = c.pool.QueryRow(ctx, sqlThumbnail, tenant, id).Scan(&png)
	if errors.Is(err, pgx.ErrNoRows) {
		c.fail(w, r, http.StatusNotFound, "Not found.")
		return
	}
	if err != nil {
		c.failErr(w, r, "read the thumbnail", err)
		return
	}
	w.Header().Set("Content-Type", http.DetectContentType(png))
	w.Header().Set("Content-Length", fmt.Sprint(len(png)))
	_, _ = w.Write(png)
}
