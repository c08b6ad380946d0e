package httpapi

import (
	"net/http"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/notes"
)

// limitsPattern is the route of the server's horizons and limits (SPEC §10).
const limitsPattern = "/v1/limits"

// Limits is the body of GET /v1/limits: the horizons a client must respect
// (a key older than KeyRetention may have been forgotten and would execute
// again) and the limits its requests meet.
type Limits struct {
	// ResponseRetention is QUILL_IDEMPOTENCY_RETENTION as a Go duration
	// ("72h").
	ResponseRetention string `json:"response_retention"`
	// KeyRetention is QUILL_KEY_RETENTION as a Go duration ("720h").
	KeyRetention string `json:"key_retention"`
	// MaxBodyBytes is QUILL_MAX_BODY_BYTES.
	MaxBodyBytes int64 `json:"max_body_bytes"`
	// MaxAttachmentBytes is QUILL_MAX_ATTACHMENT_BYTES.
	MaxAttachmentBytes int `json:"max_attachment_bytes"`
	// TenantConcurrency is QUILL_TENANT_CONCURRENCY.
	TenantConcurrency int `json:"tenant_concurrency"`
}

// limits returns the answer of GET /v1/limits: c's limits (defaults
// applied) and the retentions the notes service runs with, read from it so
// that what the API reports cannot differ from what it does.
func (c Config) limits(svc *notes.Service) Limits {
	response, key := svc.Retentions()
	return Limits{
		ResponseRetention:  contract.FormatDuration(response),
		KeyRetention:       contract.FormatDuration(key),
		MaxBodyBytes:       c.MaxBodyBytes,
		MaxAttachmentBytes: c.MaxAttachmentBytes,
		TenantConcurrency:  c.TenantConcurrency,
	}
}

// getLimits answers the server's horizons and limits. They are the
// settings the API runs with, so a client takes its key retention from the
// server it talks to rather than from a constant of its own (decision 0047).
func (s *server) getLimits(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Config.limits(s.Notes))
}
