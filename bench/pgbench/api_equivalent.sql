-- Every statement one API note create sends, in the API's three round trips
-- and pipelined the way pgx sends its batches — PostgreSQL's share of a
-- create without Go, HTTP or JSON:
--   1. the token lookup;
--   2. BEGIN, the operation's advisory lock, the read of its record;
--   3. the note, its outbox event, pg_notify, the operation record, COMMIT.
-- Rows as in one_by_one.sql. Needs pgbench -M extended or prepared (pipelines).
-- The NOTIFY goes to a channel nobody listens on; it costs the same: every
-- committing transaction that notified takes one database-wide lock.
\set r random(1, 9000000000000000000)
SELECT tenant, hash FROM bench_raw.api_tokens WHERE prefix = 'qt_00000000' AND revoked_at IS NULL;
\startpipeline
BEGIN;
SELECT pg_try_advisory_xact_lock(:r);
SELECT tenant, key, action, version, fingerprint, field_hashes,
       coalesce(resource, ''), response_status, response_body, coalesce(response_location, ''),
       created_at, completed_at, expires_at, forget_at, compacted_at
FROM bench_raw.operations WHERE tenant = 'bench' AND key = 'pgb-' || :client_id::text || '-' || :r::text;
\endpipeline
\startpipeline
INSERT INTO bench_raw.notes (id, tenant, title, body, created_at)
VALUES (md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'bench', 'bench note pgb-' || :client_id::text || '-' || :r::text,
        rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '), now());
INSERT INTO bench_raw.outbox_events (id, tenant, operation_key, aggregate_id, type, payload, traceparent, created_at)
VALUES (gen_random_uuid(), 'bench', 'pgb-' || :client_id::text || '-' || :r::text, md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'note.created',
        convert_to(rpad('{"specversion":"1.0","id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 612, '","data":{"body":"lorem ipsum'), 'UTF8'),
        NULL, now());
SELECT pg_notify('quill_bench_outbox', '');
INSERT INTO bench_raw.operations (tenant, key, action, version, fingerprint, field_hashes, resource,
        response_status, response_body, response_location, created_at, completed_at, expires_at, forget_at)
VALUES ('bench', 'pgb-' || :client_id::text || '-' || :r::text, 'create-note', 1,
        sha256(convert_to(:r::text, 'UTF8')),
        ('{"body": "' || md5(:r::text) || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || '", "title": "' || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || md5(:r::text)
          || '", "attachment": "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"}')::jsonb,
        '/v1/notes/' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 201,
        convert_to(rpad('{"id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 359, '","body":"lorem ipsum'), 'UTF8'),
        '/v1/notes/' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, now(), now(), now() + interval '72 hours', now() + interval '720 hours');
COMMIT;
\endpipeline
