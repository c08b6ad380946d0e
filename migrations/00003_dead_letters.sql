-- +goose Up

-- Messages a consumer gave up on: an event it could never parse, or one whose
-- processing failed QUILL_MAX_DELIVER times. The message is acknowledged once
-- its row is committed, so nothing is lost: an operator lists the rows
-- (attachment-worker dead-letters list) and re-drives one after fixing the
-- cause (attachment-worker dead-letters retry ID), which republishes payload
-- to subject and sets retried_at. event_id is text: an unparseable event may
-- have no valid id (then it is the Nats-Msg-Id, or empty).
CREATE TABLE dead_letters (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text        NOT NULL,
    event_id    text        NOT NULL,
    stream_seq  bigint      NOT NULL,
    subject     text        NOT NULL,
    payload     bytea       NOT NULL,
    headers     jsonb       NOT NULL DEFAULT '{}',
    error       text        NOT NULL,
    deliveries  integer     NOT NULL,
    created_at  timestamptz NOT NULL,
    retried_at  timestamptz
);
CREATE INDEX dead_letters_open_idx ON dead_letters (consumer, id) WHERE retried_at IS NULL;

-- +goose Down
DROP TABLE dead_letters;
