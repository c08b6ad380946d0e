-- The consumer package's tables. {{inbox}} and {{dead_letters}} stand for
-- the prefixed table names (Config.TablePrefix); Migrate substitutes them.

-- One row per event whose effect committed, keyed by the durable consumer
-- and the CloudEvents id: a second delivery of the event finds it and has
-- no effect.
CREATE TABLE {{inbox}} (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    event_type   text        NOT NULL,
    stream_seq   bigint      NOT NULL,
    deliveries   integer     NOT NULL,
    processed_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, event_id)
);

-- The inbox cleanup deletes the oldest rows first.
CREATE INDEX {{inbox}}_processed_at ON {{inbox}} (processed_at);

-- Messages the consumer gave up on, with why, so that an operator can look
-- and republish. event_id is '' when the message was not an event at all.
CREATE TABLE {{dead_letters}} (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer   text        NOT NULL,
    event_id   text        NOT NULL,
    event_type text        NOT NULL,
    subject    text        NOT NULL,
    stream_seq bigint      NOT NULL,
    deliveries integer     NOT NULL,
    reason     text        NOT NULL,
    headers    jsonb       NOT NULL,
    payload    bytea       NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE INDEX {{dead_letters}}_consumer ON {{dead_letters}} (consumer, id);
