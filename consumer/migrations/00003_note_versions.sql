-- The version guard's table (Config.Versions): per consumer and note, the
-- note's version whose event the consumer applied last, written in the
-- transaction of that event's effect, so that a rollback takes both back.
-- A note event whose version is not above it is stale; under the in-order
-- mode one more than one above it waits for its predecessor. note_id is
-- the event's subject as it came: the guard runs before any handler could
-- refuse a subject that is not a UUID.
CREATE TABLE {{versions}} (
    consumer   text        NOT NULL,
    tenant     text        NOT NULL,
    note_id    text        NOT NULL,
    -- 0 only inside the transaction that inserted the row to lock it.
    version    bigint      NOT NULL CHECK (version >= 0),
    -- The event applied last was the note's note.deleted: no later
    -- version can come, and the row may be forgotten after the retention.
    deleted    boolean     NOT NULL DEFAULT false,
    applied_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, tenant, note_id)
);

-- The cleanup forgets the rows of deleted notes, oldest first.
CREATE INDEX {{versions}}_deleted ON {{versions}} (applied_at) WHERE deleted;
