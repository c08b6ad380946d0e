-- +goose Up

-- Operator tokens sign in to the operator console (SPEC §8; decision 0062).
-- They are a table of their own rather than a flag on api_tokens: an
-- operator acts for no tenant, and a tenant token must never be mistaken
-- for one, nor the other way round — the scheme of the token itself
-- (qo_ against qt_) already tells them apart before any query. Only the
-- SHA-256 of the token is stored, as for tenant tokens.
CREATE TABLE operator_tokens (
    prefix      text        PRIMARY KEY CHECK (prefix ~ '^qo_[0-9a-f]{8}$'),
    hash        bytea       NOT NULL UNIQUE,
    name        text        NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$'),
    created_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);

-- +goose Down
DROP TABLE operator_tokens;
