-- +goose Up

-- The secret from which the API derives note ids (decision 0050): an id is
-- an HMAC of (tenant, operation key, generation) under it, so that an
-- operation executed again after a restore from a backup gets the id it had
-- before, while nobody without the database can compute or test ids. It
-- lives in the database so that a restore brings back the secret that made
-- the ids it holds; it is made once, here, and never changes: 32 bytes of
-- two version-4 UUIDs, 244 random bits.
CREATE TABLE id_secret (
    one    boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret bytea   NOT NULL CHECK (length(secret) = 32)
);
INSERT INTO id_secret (secret)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));

-- Derived ids are not time-ordered: a tenant's list is ordered by creation
-- time, the id breaking ties. The index it replaces served only the list.
CREATE INDEX notes_tenant_live_created_idx ON notes (tenant, created_at DESC, id DESC) WHERE deleted_at IS NULL;
DROP INDEX notes_tenant_live_idx;

-- +goose Down
CREATE INDEX notes_tenant_live_idx ON notes (tenant, id DESC) WHERE deleted_at IS NULL;
DROP INDEX notes_tenant_live_created_idx;
DROP TABLE id_secret;
