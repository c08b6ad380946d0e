-- +goose Up

-- The W3C tracestate that goes with an event's traceparent (decision
-- 0059): vendors' trace data, kept from the writing request to the
-- published message. NULL when the request carried none. Adding a nullable
-- column without a default rewrites nothing.
ALTER TABLE outbox_events ADD COLUMN tracestate text;

-- +goose Down
ALTER TABLE outbox_events DROP COLUMN tracestate;
