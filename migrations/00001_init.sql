-- +goose Up

-- API tokens: the only source of a request's tenant. The token itself is never
-- stored; hash is SHA-256 of the full token, prefix is its public part used to
-- revoke it.
CREATE TABLE api_tokens (
    prefix      text        PRIMARY KEY,
    hash        bytea       NOT NULL UNIQUE,
    tenant      text        NOT NULL CHECK (tenant ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);

CREATE TABLE notes (
    id          uuid        PRIMARY KEY,
    tenant      text        NOT NULL,
    title       text        NOT NULL,
    body        text        NOT NULL,
    created_at  timestamptz NOT NULL,
    deleted_at  timestamptz
);
-- Newest first per tenant: ids are UUIDv7, so id order is creation order.
CREATE INDEX notes_tenant_live_idx ON notes (tenant, id DESC) WHERE deleted_at IS NULL;

CREATE TABLE attachments (
    id            uuid        PRIMARY KEY,
    tenant        text        NOT NULL,
    note_id       uuid        NOT NULL UNIQUE REFERENCES notes (id),
    filename      text        NOT NULL,
    content_type  text        NOT NULL,
    size          integer     NOT NULL CHECK (size >= 0),
    sha256        text        NOT NULL,
    data          bytea       NOT NULL,
    status        text        NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'processed', 'failed')),
    result        jsonb,
    reason        text,
    thumbnail     bytea,
    processed_at  timestamptz
);

-- One row per (tenant, key): the operation record. A row exists only once its
-- operation committed; an executing operation is visible to others through a
-- transaction-scoped advisory lock on the key, never through a placeholder row.
-- After the response retention the row is compacted to a tombstone
-- (response_body NULL); after the key retention it is deleted.
CREATE TABLE operations (
    tenant             text        NOT NULL,
    key                text        NOT NULL,
    action             text        NOT NULL,
    version            integer     NOT NULL,
    fingerprint        bytea       NOT NULL,
    field_hashes       jsonb       NOT NULL,
    resource           text,
    response_status    integer     NOT NULL,
    response_body      bytea,
    response_location  text,
    created_at         timestamptz NOT NULL,
    completed_at       timestamptz NOT NULL,
    expires_at         timestamptz NOT NULL,
    forget_at          timestamptz NOT NULL,
    compacted_at       timestamptz,
    PRIMARY KEY (tenant, key),
    CHECK (forget_at >= expires_at)
);
CREATE INDEX operations_expires_idx ON operations (expires_at) WHERE compacted_at IS NULL;
CREATE INDEX operations_forget_idx ON operations (forget_at);

-- The transactional outbox. type is the event name (note.created); the relay
-- builds the subject <prefix>.<tenant>.<type>. payload is the CloudEvents JSON,
-- fixed at write time so every republish is byte-identical. seq is assigned inside the writing transaction;
-- every transaction that writes an event for a note holds that note's row
-- lock, so per note seq order is commit order.
CREATE TABLE outbox_events (
    seq            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id             uuid        NOT NULL UNIQUE,
    tenant         text        NOT NULL,
    operation_key  text,
    aggregate_id   uuid        NOT NULL,
    type           text        NOT NULL,
    payload        bytea       NOT NULL,
    traceparent    text,
    created_at     timestamptz NOT NULL,
    published_at   timestamptz,
    stream_seq     bigint,
    claimed_until  timestamptz,
    claimed_by     text,
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text,
    parked_at      timestamptz,
    parked_reason  text
);
CREATE INDEX outbox_events_unpublished_idx ON outbox_events (aggregate_id, seq) WHERE published_at IS NULL;
CREATE INDEX outbox_events_operation_idx ON outbox_events (tenant, operation_key) WHERE operation_key IS NOT NULL;
CREATE INDEX outbox_events_published_idx ON outbox_events (published_at) WHERE published_at IS NOT NULL;

-- +goose Down
DROP TABLE outbox_events;
DROP TABLE operations;
DROP TABLE attachments;
DROP TABLE notes;
DROP TABLE api_tokens;
