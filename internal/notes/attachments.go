package notes

import (
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// This package is the one writer of the attachments table: the create's
// insert in the claim statement (service.go) and, for the attachment worker, the statements
// below, which queue into the worker's own pipelined transaction so that its
// inbox rows, results, events and COMMIT still travel together.

const (
	sqlAttachmentsProcessed = `UPDATE attachments a SET status = v.status, result = v.result::jsonb,
		reason = nullif(v.reason, ''), thumbnail = v.thumbnail, processed_at = $1
	FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::bytea[]) AS v(id, status, result, reason, thumbnail)
	WHERE a.id = v.id`

	sqlAttachmentSkipped = `UPDATE attachments SET reason = $2 WHERE id = $1 AND status = 'pending'`
)

// AttachmentResult is the outcome of processing one attachment.
type AttachmentResult struct {
	ID uuid.UUID
	// Status is AttachmentProcessed or AttachmentFailed.
	Status string
	// Result is the processing result as JSON (nil when failed).
	Result []byte
	// Reason says why processing failed ("" when it did not).
	Reason    string
	Thumbnail []byte
}

// QueueAttachmentsProcessed queues into b the statement that stores results,
// processed at now. It queues nothing for no results.
func QueueAttachmentsProcessed(b *pgx.Batch, now time.Time, results []AttachmentResult) {
	if len(results) == 0 {
		return
	}
	ids := make([]pgtype.UUID, len(results))
	states := make([]string, len(results))
	docs := make([]*string, len(results))
	reasons := make([]string, len(results))
	thumbs := make([][]byte, len(results))
	for i, r := range results {
		ids[i], states[i], reasons[i], thumbs[i] = pgUUID(r.ID), r.Status, r.Reason, r.Thumbnail
		if r.Result != nil {
			s := string(r.Result)
			docs[i] = &s
		}
	}
	b.Queue(sqlAttachmentsProcessed, now, ids, states, docs, reasons, thumbs)
}

// QueueAttachmentSkipped queues into b the statement that records reason on
// attachment id while it is still pending: its processing was skipped for
// good (the note was deleted first).
func QueueAttachmentSkipped(b *pgx.Batch, id uuid.UUID, reason string) {
	b.Queue(sqlAttachmentSkipped, pgUUID(id), reason)
}
