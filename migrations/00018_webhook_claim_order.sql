-- +goose Up

-- The dispatcher's claim (internal/dispatch sqlClaim) takes the due
-- deliveries in (next_attempt_at, id) order and stops at its LIMIT: this
-- index is that order, so the claim reads the first rows of it and no
-- more. The index it replaces held only next_attempt_at: the claim sorted
-- every pending row to find the first few (decision 0089).
CREATE INDEX webhook_deliveries_due_order ON webhook_deliveries (next_attempt_at, id) WHERE state = 'pending';
DROP INDEX webhook_deliveries_due;
-- The claim for the endpoints a dispatcher is sending to (sqlClaimFor):
-- each one's due deliveries in the same order, up to its room.
CREATE INDEX webhook_deliveries_endpoint_due ON webhook_deliveries (endpoint_id, next_attempt_at, id) WHERE state = 'pending';

-- +goose Down
DROP INDEX webhook_deliveries_endpoint_due;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
DROP INDEX webhook_deliveries_due_order;
