-- Empties the scratch tables between pgbench runs (scripts/bench-api.sh), so
-- that every run starts from the same, empty tables, as the API's runs do.
TRUNCATE bench_raw.notes, bench_raw.attachments, bench_raw.operations, bench_raw.outbox_events, bench_raw.outbox_pending RESTART IDENTITY;
