-- +goose Up

-- The relay claims the oldest unpublished, unparked events first.
CREATE INDEX outbox_events_claimable_idx ON outbox_events (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- The attachment worker's inbox: one row per (consumer, event id) it has
-- processed, inserted in the transaction of the processing itself, so a
-- redelivered event is recognised and acknowledged without a second effect.
-- Rows are deleted after QUILL_INBOX_RETENTION (≥ the stream's MaxAge).
CREATE TABLE inbox (
    consumer      text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX inbox_processed_idx ON inbox (processed_at);

-- +goose Down
DROP TABLE inbox;
DROP INDEX outbox_events_claimable_idx;
