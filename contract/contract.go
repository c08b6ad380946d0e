// Package contract holds the names of Quill's contract (SPEC.md) that the
// server, the client and consumers share: event types and their CloudEvents
// form, subjects and the stream's default names, the actions of operation
// records, resource paths, the tenant name and the problem codes with their
// retry advice. Each name is defined here once, so that the API, the relay,
// the worker, the audit, the client, the CLI and every consumer cannot drift
// apart. It imports only the standard library: a user's `go list -deps` of
// the client or a consumer gains nothing from it.
//
// Adding an event type, an action or a problem code is one line in this
// file (and, for an event type, its line in EventTypes).
package contract

import (
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Event types, as subjects name them (<prefix>.<tenant>.<aggregate>.<event>)
// and outbox_events.type stores them (SPEC §5). CloudEventType gives the
// CloudEvents type of each.
const (
	EventNoteCreated         = "note.created"
	EventNoteUpdated         = "note.updated"
	EventNoteDeleted         = "note.deleted"
	EventAttachmentProcessed = "attachment.processed"
)

// EventTypes returns every event type, in SPEC §5's order. The slice is
// the caller's.
func EventTypes() []string {
	return []string{EventNoteCreated, EventNoteUpdated, EventNoteDeleted, EventAttachmentProcessed}
}

// CloudEventType returns the CloudEvents type of an event type, e.g.
// quill.note.created.v1.
func CloudEventType(eventType string) string { return "quill." + eventType + ".v1" }

// EventTypeOf returns the event type whose CloudEvents type is ceType
// (quill.note.created.v1 → note.created), and false when ceType is not the
// CloudEvents type of one of EventTypes.
func EventTypeOf(ceType string) (string, bool) {
	for _, t := range EventTypes() {
		if CloudEventType(t) == ceType {
			return t, true
		}
	}
	return "", false
}

// DataSchemaPrefix starts the CloudEvents dataschema of every event: the $id
// of the JSON Schema of its data (api/schemas/<type>.json, served by the API
// at /schemas/<type>.json). A URN, not a URL: the envelope is fixed when the
// event is written, and no address of a deployment belongs in bytes that
// outlive it (decision 0051).
const DataSchemaPrefix = "urn:quill:schema:"

// DataSchema returns the CloudEvents dataschema of an event type, e.g.
// urn:quill:schema:quill.note.created.v1.
func DataSchema(eventType string) string { return DataSchemaPrefix + CloudEventType(eventType) }

// sourcePrefix starts an event's CloudEvents source, /tenants/<tenant>.
const sourcePrefix = "/tenants/"

// Source returns the CloudEvents source of tenant's events:
// /tenants/<tenant>.
func Source(tenant string) string { return sourcePrefix + tenant }

// SourceTenant returns the tenant a CloudEvents source names, what follows
// /tenants/, and false when source does not start with /tenants/. Whether
// that is a valid tenant name is ValidTenant's to say.
func SourceTenant(source string) (string, bool) {
	t, ok := strings.CutPrefix(source, sourcePrefix)
	if !ok {
		return "", false
	}
	return t, true
}

// The stream's default names (QUILL_STREAM, QUILL_SUBJECT_PREFIX).
const (
	DefaultStream        = "QUILL_EVENTS"
	DefaultSubjectPrefix = "quill"
)

// Subject returns the subject of tenant's event of eventType under prefix:
// <prefix>.<tenant>.<aggregate>.<event>.
func Subject(prefix, tenant, eventType string) string {
	return prefix + "." + tenant + "." + eventType
}

// AllSubjects is the filter of every subject under prefix: <prefix>.>.
func AllSubjects(prefix string) string { return prefix + ".>" }

// TenantSubjects is the filter of every subject of tenant:
// <prefix>.<tenant>.>.
func TenantSubjects(prefix, tenant string) string { return prefix + "." + tenant + ".>" }

// TypeSubjects is the filter of every tenant's events of eventType:
// <prefix>.*.<aggregate>.<event>.
func TypeSubjects(prefix, eventType string) string { return prefix + ".*." + eventType }

// SubjectTenant returns the tenant token of a subject under prefix, or ""
// when the subject is not under prefix.
func SubjectTenant(prefix, subject string) string {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return ""
	}
	tenant, _, _ := strings.Cut(rest, ".")
	return tenant
}

// Actions, as operation records, the outcome lookup (SPEC §4.6), the
// fingerprint and the metrics name them.
const (
	ActionCreateNote = "create-note"
	ActionUpdateNote = "update-note"
	ActionDeleteNote = "delete-note"
	// The webhook endpoints' writes (SPEC §11).
	ActionCreateWebhook       = "create-webhook"
	ActionDeleteWebhook       = "delete-webhook"
	ActionRotateWebhookSecret = "rotate-webhook-secret"
)

// Actions returns every action. The slice is the caller's.
func Actions() []string {
	return []string{ActionCreateNote, ActionUpdateNote, ActionDeleteNote,
		ActionCreateWebhook, ActionDeleteWebhook, ActionRotateWebhookSecret}
}

// Idempotency outcomes of a write, the outcome label of
// quill_idempotency_requests_total (SPEC §8).
const (
	OutcomeExecuted   = "executed"
	OutcomeReplayed   = "replayed"
	OutcomeKeyReused  = "key_reused"
	OutcomeInProgress = "in_progress"
	OutcomeExpired    = "expired"
)

// Outcomes returns every idempotency outcome. The slice is the caller's.
func Outcomes() []string {
	return []string{OutcomeExecuted, OutcomeReplayed, OutcomeKeyReused, OutcomeInProgress, OutcomeExpired}
}

// Operation states of the outcome lookup (SPEC §4.6).
const (
	OperationCompleted  = "completed"
	OperationInProgress = "in_progress"
)

// NotesPath is the notes collection: POST to create, GET to list.
const NotesPath = "/v1/notes"

// notePathPrefix starts the path of one note.
const notePathPrefix = NotesPath + "/"

// NotePath returns the path of note id, /v1/notes/{id}: its Location, and
// the resource its operation record and a 410 name.
func NotePath(id string) string { return notePathPrefix + url.PathEscape(id) }

// ParseNotePath returns the id of the note path names (NotePath's inverse), and
// false when path is not the path of one note.
func ParseNotePath(path string) (string, bool) {
	id, ok := strings.CutPrefix(path, notePathPrefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", false
	}
	id, err := url.PathUnescape(id)
	return id, err == nil
}

// WebhooksPath is the webhook endpoints collection: POST to create, GET to
// list.
const WebhooksPath = "/v1/webhooks"

// WebhookPath returns the path of webhook endpoint id, /v1/webhooks/{id}.
func WebhookPath(id string) string { return WebhooksPath + "/" + url.PathEscape(id) }

// TenantPattern is a tenant name (SPEC §5): it is a subject token, so one
// lower-case letter or digit, then up to 62 of them or hyphens.
const TenantPattern = `^[a-z0-9][a-z0-9-]{0,62}$`

var tenantRE = regexp.MustCompile(TenantPattern)

// ValidTenant reports whether name matches TenantPattern.
func ValidTenant(name string) bool { return tenantRE.MatchString(name) }

// Problem codes, stable and exact (SPEC §3): a problem document's code and
// the last part of its type, urn:quill:problem:<code>.
const (
	CodeKeyMissing       = "idempotency_key_missing"
	CodeKeyInvalid       = "idempotency_key_invalid"
	CodeInvalidJSON      = "invalid_json"
	CodeValidation       = "validation_failed"
	CodeUnauthenticated  = "unauthenticated"
	CodeNotFound         = "not_found"
	CodeOpNotFound       = "operation_not_found"
	CodeInProgress       = "operation_in_progress"
	CodeResultExpired    = "operation_result_expired"
	CodeTooLarge         = "payload_too_large"
	CodeUnsupportedMedia = "unsupported_media_type"
	CodeKeyReused        = "idempotency_key_reused"
	// CodePreconditionFailed: If-Match names another version than the
	// note's (the problem's current_version names the note's); final.
	CodePreconditionFailed = "precondition_failed"
	// CodePreconditionRequired: a PATCH without If-Match.
	CodePreconditionRequired = "precondition_required"
	CodeUnavailable          = "unavailable"
	CodeRateLimited          = "rate_limited"
	CodeInternal             = "internal_error"
	CodeMethodNotAllowed     = "method_not_allowed"
	// The request could not be read as HTTP at all (decision 0066):
	// answered by the server before any handler runs.
	CodeBadRequest                  = "bad_request"
	CodeHeadersTooLarge             = "headers_too_large"
	CodeUnsupportedTransferEncoding = "unsupported_transfer_encoding"
	// CodeWebhookLimitReached: a create past the tenant's live endpoints
	// limit; recorded, final for the key: delete one, then create under a
	// new key.
	CodeWebhookLimitReached = "webhook_limit_reached"
	// CodeWebhooksNotConfigured: the deployment has no
	// QUILL_WEBHOOK_SECRET_KEY; nothing a client sends changes it.
	CodeWebhooksNotConfigured = "webhooks_not_configured"
)

// Retry advice of a problem (SPEC §3): what a client should do next.
const (
	// RetrySameKey: send the same request with the same key (after
	// Retry-After when given).
	RetrySameKey = "same_key"
	// RetryAfterFixing: the request itself is wrong.
	RetryAfterFixing = "after_fixing"
	// RetryNo: the answer is final for this key.
	RetryNo = "no"
)

// FormatDuration writes d as the API writes a duration (GET /v1/limits) and
// the client quotes one back: a Go duration without the zero minutes and
// seconds time.Duration.String appends (720h, 90m → 1h30m, 1h0m30s, 1.5s).
// time.ParseDuration reads the result back to d.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}
