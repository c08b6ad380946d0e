-- Several consumers share the tables, each under its own name (the
-- durable consumer's): Quill's attachment worker and webhook dispatcher on
-- Quill's own database, or the services of one team on theirs.

-- How many other deliveries of an event were recognised as duplicates,
-- counted in the transaction that recognised each one: the audit's
-- figure of redeliveries suppressed. Rows written before it count 0.
ALTER TABLE {{inbox}} ADD COLUMN duplicates integer NOT NULL DEFAULT 0;

-- A dead letter re-driven (republished to its subject) is marked, not
-- deleted: it stays listed with --all, and the open ones are what the
-- gauges and the console show.
ALTER TABLE {{dead_letters}} ADD COLUMN retried_at timestamptz;
CREATE INDEX {{dead_letters}}_open ON {{dead_letters}} (consumer, id) WHERE retried_at IS NULL;
