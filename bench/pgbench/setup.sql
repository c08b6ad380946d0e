-- Scratch tables for the raw PostgreSQL ceiling of `make bench-api`
-- (scripts/bench-api.sh runs this in the quill_bench database after
-- `api migrate`). They are copies of the tables one note create writes
-- — same columns, defaults, identity, constraints and indexes (LIKE ...
-- INCLUDING ALL) — in their own schema, so the pgbench runs never touch the
-- API's rows and can be truncated independently.
DROP SCHEMA IF EXISTS bench_raw CASCADE;
CREATE SCHEMA bench_raw;
CREATE TABLE bench_raw.notes (LIKE public.notes INCLUDING ALL);
CREATE TABLE bench_raw.operations (LIKE public.operations INCLUDING ALL);
CREATE TABLE bench_raw.outbox_events (LIKE public.outbox_events INCLUDING ALL);
-- An outbox insert also queues the event for the relays (migration 00007's
-- trigger, which LIKE does not copy): the same trigger on the copy, so the
-- raw inserts pay for the queue row as the API's do.
CREATE TABLE bench_raw.outbox_pending (LIKE public.outbox_pending INCLUDING ALL);
CREATE FUNCTION bench_raw.outbox_pending_on_insert() RETURNS trigger LANGUAGE plpgsql SET search_path = bench_raw AS $$
BEGIN
    INSERT INTO outbox_pending (seq, aggregate_id, parked)
    SELECT seq, aggregate_id, parked_at IS NOT NULL FROM outbox_new WHERE published_at IS NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_pending_insert AFTER INSERT ON bench_raw.outbox_events
    REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION bench_raw.outbox_pending_on_insert();
-- For api_equivalent.sql: the token lookup reads a copy of api_tokens.
CREATE TABLE bench_raw.api_tokens (LIKE public.api_tokens INCLUDING ALL);
INSERT INTO bench_raw.api_tokens (prefix, hash, tenant, created_at)
VALUES ('qt_00000000', sha256('qt_00000000_bench'::bytea), 'bench', now());
