-- +goose Up

-- The relay claims an event with a session-level advisory lock instead of a
-- lease written into the row (claimed_until): the claim writes nothing, and
-- it ends when the relay lets go or its session ends. Dropping the column
-- also stops a relay of the previous version, whose claims the new relays
-- would not see, from running beside them.
ALTER TABLE outbox_events DROP COLUMN claimed_until;

-- Whether the stream acknowledged the event as a duplicate of a message it
-- already held (a republish after a relay crashed or failed to mark),
-- recorded with published_at and stream_seq by the same update.
ALTER TABLE outbox_events ADD COLUMN ack_duplicate boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE outbox_events DROP COLUMN ack_duplicate;
ALTER TABLE outbox_events ADD COLUMN claimed_until timestamptz;
