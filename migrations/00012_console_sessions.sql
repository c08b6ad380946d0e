-- +goose Up

-- The operator console's session keys (decision 0068): a session cookie is
-- signed with the newest key; an older key still verifies the sessions it
-- signed until they expire. "api console rotate-key" adds a key (and with
-- --end-sessions drops every older one). The first key is made here, 32
-- bytes of two version-4 UUIDs (244 random bits), as migration 00009 makes
-- the id secret; those "rotate-key" makes are 256 random bits.
CREATE TABLE console_session_keys (
    id         integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    secret     bytea       NOT NULL CHECK (length(secret) = 32),
    created_at timestamptz NOT NULL
);
INSERT INTO console_session_keys (secret, created_at)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'), now());

-- Sessions ended by signing out, kept until they would have expired, so
-- that a signed-out cookie replayed is refused.
CREATE TABLE console_signouts (
    session_id text        PRIMARY KEY CHECK (session_id ~ '^[0-9a-f]{32}$'),
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE console_signouts;
DROP TABLE console_session_keys;
