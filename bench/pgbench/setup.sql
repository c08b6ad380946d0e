-- Scratch tables for the raw PostgreSQL ceiling of `make bench-api`
-- (scripts/bench-api.sh runs this in the quill_bench database after
-- `api migrate`). They are copies of the tables one note create or update
-- reads and writes — same columns, defaults, identity, constraints and
-- indexes (LIKE ... INCLUDING ALL) — in their own schema, so the pgbench runs
-- never touch the API's rows and can be truncated independently.
DROP SCHEMA IF EXISTS bench_raw CASCADE;
CREATE SCHEMA bench_raw;
CREATE TABLE bench_raw.notes (LIKE public.notes INCLUDING ALL);
CREATE TABLE bench_raw.operations (LIKE public.operations INCLUDING ALL);
CREATE TABLE bench_raw.outbox_events (LIKE public.outbox_events INCLUDING ALL);
-- For api_update_equivalent.sql: the API's update reads the note joined to
-- its attachment (none here, as in the API's run), so the join has a table.
CREATE TABLE bench_raw.attachments (LIKE public.attachments INCLUDING ALL);
-- An outbox insert also queues the event for the relays (migration 00007's
-- trigger, which LIKE does not copy): the same trigger on the copy, so the
-- raw inserts pay for the queue row as the API's do.
CREATE TABLE bench_raw.outbox_pending (LIKE public.outbox_pending INCLUDING ALL);
-- The migration's own function, moved to bench_raw (its definition names
-- the schema twice: the function's and its pinned search_path).
DO $$
BEGIN
    EXECUTE replace(replace(pg_get_functiondef('public.outbox_pending_on_insert'::regproc),
        'public.', 'bench_raw.'), '''public''', '''bench_raw''');
END
$$;
CREATE TRIGGER outbox_pending_insert AFTER INSERT ON bench_raw.outbox_events
    REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION bench_raw.outbox_pending_on_insert();
-- For api_equivalent.sql: the token lookup reads a copy of api_tokens.
CREATE TABLE bench_raw.api_tokens (LIKE public.api_tokens INCLUDING ALL);
INSERT INTO bench_raw.api_tokens (prefix, hash, tenant, created_at)
VALUES ('qt_00000000', sha256('qt_00000000_bench'::bytea), 'bench', now());
