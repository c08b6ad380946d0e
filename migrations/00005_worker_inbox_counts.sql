-- +goose Up

-- Durable delivery counts of the worker's inbox, for audits:
-- deliveries is the JetStream delivery count (NumDelivered) of the message
-- whose processing committed the row; duplicates is how many other
-- deliveries of the same event the consumer recognised as duplicates (and
-- acknowledged without a second effect), incremented in the transaction that
-- recognised each one. Rows written before this migration keep deliveries 1
-- and duplicates 0: their counts were not recorded.
ALTER TABLE inbox
    ADD COLUMN deliveries integer NOT NULL DEFAULT 1,
    ADD COLUMN duplicates integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE inbox
    DROP COLUMN duplicates,
    DROP COLUMN deliveries;
