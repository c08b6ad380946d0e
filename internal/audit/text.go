package audit

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/quillhq/quill/contract"
)

// WriteText writes the report for a person: the anomalies, the chains, the
// counts, the stream check and the notes, ending with a one-line verdict.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	scope := "all tenants"
	switch {
	case r.Scope.Key != "":
		scope = fmt.Sprintf("tenant %s, key %q", r.Scope.Tenant, r.Scope.Key)
	case r.Scope.Tenant != "":
		scope = "tenant " + r.Scope.Tenant
	}
	h := r.Horizons
	fmt.Fprintf(&b, "audit of %s at %s\n", scope, r.Scope.At)
	fmt.Fprintf(&b, "horizons: key retention %s, response retention %s, outbox retention %s, inbox retention %s, stream max age %s; pending > %s, unprocessed > %s, margin %s\n",
		h.KeyRetention, h.ResponseRetention, h.OutboxRetention, h.InboxRetention, orDash(h.StreamMaxAge), h.PendingThreshold, h.ProcessThreshold, h.Margin)

	if len(r.Anomalies) > 0 {
		fmt.Fprintf(&b, "\nANOMALIES (%d)\n", len(r.Anomalies))
		for _, x := range r.Anomalies {
			who := x.Tenant
			if x.Key != "" {
				who += "/" + x.Key
			}
			fmt.Fprintf(&b, "  %-26s %s", x.Kind, orDash(who))
			if x.EventID != "" {
				fmt.Fprintf(&b, " event %s", x.EventID)
			}
			if x.NoteID != "" {
				fmt.Fprintf(&b, " note %s", x.NoteID)
			}
			if x.AttachmentID != "" {
				fmt.Fprintf(&b, " attachment %s", x.AttachmentID)
			}
			fmt.Fprintf(&b, "\n      %s\n", x.Detail)
		}
	}

	if len(r.Chains) > 0 {
		fmt.Fprintf(&b, "\nCHAINS (%d)\n", len(r.Chains))
		for _, c := range r.Chains {
			writeChain(&b, c)
		}
	}

	c := r.Counts
	fmt.Fprintf(&b, "\nCOUNTS\n")
	fmt.Fprintf(&b, "  requests           %d  (%d operations executed + %d replays)\n", c.Requests, c.Operations, c.Replays)
	var parts []string
	for _, a := range slices.Sorted(maps.Keys(c.ByAction)) {
		parts = append(parts, fmt.Sprintf("%s %d", a, c.ByAction[a]))
	}
	fmt.Fprintf(&b, "  operations         %d  (%s; %d tombstones)\n", c.Operations, orDash(strings.Join(parts, ", ")), c.Tombstones)
	e := c.BusinessEffects
	fmt.Fprintf(&b, "  business effects   %d  (notes created %d, notes updated %d, notes deleted %d, attachments processed %d, failed %d)\n",
		e.Total, e.NotesCreated, e.NotesUpdated, e.NotesDeleted, e.AttachmentsProcessed, e.AttachmentsFailed)
	fmt.Fprintf(&b, "  events             %d  (published %d, pending %d, parked %d)\n", c.Events.Total, c.Events.Published, c.Events.Pending, c.Events.Parked)
	fmt.Fprintf(&b, "  inbox              %d rows, deliveries %s\n", c.Inbox.Rows, orNA(c.Inbox.Deliveries))
	s := c.DuplicatesSuppressed
	fmt.Fprintf(&b, "  duplicates suppressed %d: API replays %d, relay duplicate acks %s, inbox duplicates %s\n",
		s.Total, s.APIReplays, orNA(s.RelayDuplicateAcks), orNA(s.InboxDuplicates))
	fmt.Fprintf(&b, "  duplicates found   %d\n", c.DuplicatesFound)

	st := r.Stream
	if st.Checked {
		fmt.Fprintf(&b, "\nSTREAM %s: %d published events verified, %d aged out, %d messages scanned for duplicates (sequences %d..%d)\n",
			st.Name, st.Verified, st.AgedOut, st.Scanned, st.FirstSeq, st.LastSeq)
	} else {
		fmt.Fprintf(&b, "\nSTREAM %s: NOT CHECKED: %s\n", st.Name, st.Reason)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintf(&b, "\nNOTES\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "  - %s\n", n)
		}
	}
	switch {
	case len(r.Anomalies) > 0:
		fmt.Fprintf(&b, "\nRESULT: %d anomalies\n", len(r.Anomalies))
	case !r.Complete():
		fmt.Fprintf(&b, "\nRESULT: no anomaly in the database, but the audit is INCOMPLETE: the stream was not checked\n")
	default:
		fmt.Fprintf(&b, "\nRESULT: consistent, no anomaly\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeChain(b *strings.Builder, c Chain) {
	fmt.Fprintf(b, "  %s/%s  ", c.Tenant, c.Key)
	if c.State == "missing" {
		fmt.Fprintf(b, "NO OPERATION RECORD")
	} else {
		fmt.Fprintf(b, "%s %s %d %s  created %s  replays %d", c.Action, c.State, c.Status, orDash(c.Resource), deref(c.CreatedAt), c.Replays)
	}
	if len(c.Anomalies) > 0 {
		fmt.Fprintf(b, "  [%s]", strings.Join(c.Anomalies, ", "))
	}
	b.WriteString("\n")
	if s := c.OutcomeSummary(); s != "" {
		fmt.Fprintf(b, "    outcome     %s\n", s)
	}
	for _, n := range c.Notes {
		fmt.Fprintf(b, "    note        %s  created %s", n.ID, n.CreatedAt)
		if n.UpdatedAt != nil {
			fmt.Fprintf(b, "  updated %s", *n.UpdatedAt)
		}
		if n.DeletedAt != nil {
			fmt.Fprintf(b, "  deleted %s", *n.DeletedAt)
		}
		fmt.Fprintf(b, "  version %d\n", n.Version)
		for _, v := range n.Versions {
			fmt.Fprintf(b, "      v%-4d %-20s %-36s %-9s key %s", v.Version, orDash(v.Type), orDash(v.EventID), v.State, orDash(v.Key))
			switch v.State {
			case "gone":
				b.WriteString("  (no event: older than the outbox retention)")
			case "missing":
				b.WriteString("  (no event, and no retention explains it)")
			case "cleaned":
				b.WriteString("  (cleaned from the outbox; kept by the operation record)")
			}
			b.WriteString("\n")
		}
	}
	if a := c.Attachment; a != nil {
		fmt.Fprintf(b, "    attachment  %s  %s", a.ID, a.Status)
		if a.ProcessedAt != nil {
			fmt.Fprintf(b, " %s", *a.ProcessedAt)
		}
		if a.Reason != "" {
			fmt.Fprintf(b, " (%s)", a.Reason)
		}
		b.WriteString("\n")
	}
	for _, e := range c.Events {
		version := ""
		if e.Version != 0 {
			version = fmt.Sprintf("v%d", e.Version)
		}
		fmt.Fprintf(b, "    event       %s  %-20s %-5s %s", e.ID, e.Type, version, e.State)
		if e.PublishedAt != nil {
			fmt.Fprintf(b, " %s", *e.PublishedAt)
		}
		if e.StreamSeq != nil {
			fmt.Fprintf(b, "  seq %d", *e.StreamSeq)
		}
		if e.AckDuplicate != nil && *e.AckDuplicate {
			b.WriteString("  (duplicate ack)")
		}
		if e.Stream != "" {
			fmt.Fprintf(b, "  stream %s", e.Stream)
		}
		if e.Cleaned {
			b.WriteString("  (cleaned from the outbox; kept by the operation record)")
		}
		if in := e.Inbox; in != nil {
			fmt.Fprintf(b, "  inbox %s", in.ProcessedAt)
			if in.Deliveries != nil {
				fmt.Fprintf(b, " deliveries %d", *in.Deliveries)
			}
			if in.Duplicates != nil {
				fmt.Fprintf(b, " duplicates %d", *in.Duplicates)
			}
		} else if e.Type == contract.EventNoteCreated && c.Attachment != nil && !e.Cleaned {
			b.WriteString("  no inbox row")
		}
		b.WriteString("\n")
	}
}

// OutcomeSummary says in a phrase what the chain's operation did to its
// note's version: the version it made, the one an unchanged update found,
// the one a refused write met; "" for a chain without a record.
func (c Chain) OutcomeSummary() string {
	switch c.Outcome {
	case "":
		return ""
	case "created", "updated", "deleted":
		if c.Version != 0 {
			return fmt.Sprintf("%s: made version %d", c.Outcome, c.Version)
		}
	case "unchanged":
		if c.Version != 0 {
			return fmt.Sprintf("unchanged: the note stays at version %d (no new version, no event)", c.Version)
		}
		return "unchanged: no new version, no event"
	case "version_mismatch":
		if c.CurrentVersion != 0 {
			return fmt.Sprintf("version_mismatch: If-Match named another version; the note was at version %d (current_version)", c.CurrentVersion)
		}
		return "version_mismatch: If-Match named another version than the note's"
	case "nothing_to_update", "nothing_to_delete":
		return c.Outcome + ": no live note"
	}
	return c.Outcome
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orNA(p *int64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprint(*p)
}
