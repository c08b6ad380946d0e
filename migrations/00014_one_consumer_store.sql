-- +goose Up

-- The attachment worker's inbox and dead letters move into the consumer
-- package's tables, which db.Migrate has created just before (consumer
-- migrations, quill_consumer_schema_version): one store for every consumer
-- of this database, each under its durable name (decision 0075). The rows
-- keep their consumer (QUILL_CONSUMER), counts, times and dead-letter ids.
-- What the old tables did not record is left empty: the event type ('') and
-- stream sequence (0) of an inbox row, the event type of a dead letter.

INSERT INTO quill_consumer_inbox (consumer, event_id, event_type, stream_seq, deliveries, duplicates, processed_at)
SELECT consumer, event_id, '', 0, deliveries, duplicates, processed_at FROM inbox
ON CONFLICT (consumer, event_id) DO UPDATE
    SET duplicates = quill_consumer_inbox.duplicates + excluded.duplicates;

-- +goose StatementBegin
DO $$
BEGIN
    -- Dead-letter ids are what operators retry by: they are kept, unless
    -- the table already holds dead letters of its own (a consumer built on
    -- the package ran on this database), whose ids they could meet.
    IF NOT EXISTS (SELECT 1 FROM quill_consumer_dead_letters) THEN
        INSERT INTO quill_consumer_dead_letters
            (id, consumer, event_id, event_type, subject, stream_seq, deliveries, reason, headers, payload, created_at, retried_at)
        OVERRIDING SYSTEM VALUE
        SELECT id, consumer, event_id, '', subject, stream_seq, deliveries, error, headers, payload, created_at, retried_at
        FROM dead_letters;
        PERFORM setval(pg_get_serial_sequence('quill_consumer_dead_letters', 'id'), max(id)) FROM dead_letters HAVING max(id) IS NOT NULL;
    ELSE
        INSERT INTO quill_consumer_dead_letters
            (consumer, event_id, event_type, subject, stream_seq, deliveries, reason, headers, payload, created_at, retried_at)
        SELECT consumer, event_id, '', subject, stream_seq, deliveries, error, headers, payload, created_at, retried_at
        FROM dead_letters ORDER BY id;
    END IF;
END
$$;
-- +goose StatementEnd

DROP TABLE inbox;
DROP TABLE dead_letters;

-- +goose Down

-- The tables of migrations 00002, 00003 and 00005, with the rows of every
-- consumer moved back (the consumer package's tables stay: they are its).
CREATE TABLE inbox (
    consumer      text        NOT NULL,
    event_id      uuid        NOT NULL,
    processed_at  timestamptz NOT NULL,
    deliveries    integer     NOT NULL DEFAULT 1,
    duplicates    integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX inbox_processed_idx ON inbox (processed_at);
INSERT INTO inbox (consumer, event_id, processed_at, deliveries, duplicates)
SELECT consumer, event_id, processed_at, deliveries, duplicates FROM quill_consumer_inbox;
DELETE FROM quill_consumer_inbox;

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
INSERT INTO dead_letters (id, consumer, event_id, stream_seq, subject, payload, headers, error, deliveries, created_at, retried_at)
OVERRIDING SYSTEM VALUE
SELECT id, consumer, event_id, stream_seq, subject, payload, headers, reason, deliveries, created_at, retried_at
FROM quill_consumer_dead_letters;
SELECT setval(pg_get_serial_sequence('dead_letters', 'id'), max(id)) FROM dead_letters HAVING max(id) IS NOT NULL;
DELETE FROM quill_consumer_dead_letters;
