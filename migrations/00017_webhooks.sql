-- +goose Up

-- Webhooks (SPEC §11, issue 27): tenants' HTTP endpoints and the deliveries
-- of events to them.
--
-- An endpoint's signing secret is never stored in the clear: secret_sealed
-- is the secret sealed (AES-256-GCM, internal/whsecret) under a key from the
-- environment (QUILL_WEBHOOK_SECRET_KEY), bound to the endpoint's id and
-- tenant, so a reader of the database alone cannot sign. During a rotation
-- the previous secret keeps signing beside the new one until
-- previous_secret_until.
CREATE TABLE webhook_endpoints (
    id uuid PRIMARY KEY,
    tenant text NOT NULL,
    url text NOT NULL,
    event_types text[] NOT NULL CHECK (cardinality(event_types) > 0),
    description text NOT NULL DEFAULT '',
    secret_sealed bytea NOT NULL,
    previous_secret_sealed bytea,
    previous_secret_until timestamptz,
    -- The operation that created it (its lookup lists the endpoint).
    operation_key text,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- Deleted endpoints stay (their deliveries are listed by the lookups of
    -- the operations whose events they carried); nothing is sent to one.
    deleted_at timestamptz
);
CREATE INDEX webhook_endpoints_tenant ON webhook_endpoints (tenant, created_at, id) WHERE deleted_at IS NULL;

-- An endpoint's health, apart from its settings because another process
-- writes it (each table has one writer): the API writes webhook_endpoints,
-- the dispatcher this and webhook_deliveries. No row yet reads as active and
-- never attempted.
CREATE TABLE webhook_endpoint_health (
    endpoint_id uuid PRIMARY KEY REFERENCES webhook_endpoints (id),
    -- active: deliveries are sent; disabled: failing for
    -- QUILL_WEBHOOK_DISABLE_AFTER, or answered 410 Gone (disabled_reason says
    -- which); no delivery is attempted while disabled.
    state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'disabled')),
    disabled_at timestamptz,
    disabled_reason text,
    last_attempt_at timestamptz,
    last_delivery_at timestamptz,
    last_status integer,
    last_error text,
    failures_in_row integer NOT NULL DEFAULT 0,
    failing_since timestamptz
);

-- One row per (endpoint, event): written in the dispatcher's consumer
-- transaction with the event's inbox row, so that an event is either
-- acknowledged with its deliveries recorded or redelivered; sent after it,
-- outside any transaction, and marked after each attempt. A dispatcher that
-- dies between a POST and its mark leaves the lease to run out, and the POST
-- is sent again under the same webhook-id (the event id).
CREATE TABLE webhook_deliveries (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant text NOT NULL,
    endpoint_id uuid NOT NULL REFERENCES webhook_endpoints (id),
    event_id uuid NOT NULL,
    event_type text NOT NULL,
    -- The note the event is about and its version after the change: a
    -- note's deliveries to one endpoint are sent in version order.
    aggregate_id uuid,
    aggregate_version bigint,
    -- The CloudEvent exactly as the stream carried it: the body of every
    -- attempt (the signature covers it).
    payload bytea NOT NULL,
    event_time timestamptz NOT NULL,
    state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_until timestamptz,
    last_status integer,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    first_attempt_at timestamptz,
    delivered_at timestamptz,
    failed_at timestamptz,
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_order ON webhook_deliveries (endpoint_id, aggregate_id, aggregate_version) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
CREATE INDEX webhook_deliveries_failed ON webhook_deliveries (tenant, failed_at) WHERE state = 'failed';

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoint_health;
DROP TABLE webhook_endpoints;
