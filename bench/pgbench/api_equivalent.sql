-- Every statement one API note create sends, in the API's one round trip,
-- pipelined the way pgx sends its batch — PostgreSQL's share of a create
-- without Go, HTTP or JSON: BEGIN; the claim (advisory lock + record read +
-- the transaction-local flag); the delete of a forgotten record; the note,
-- its outbox event and the operation record, each guarded by the flag;
-- COMMIT. The token lookup is cached by the API (QUILL_TOKEN_CACHE_TTL) and
-- the relays' NOTIFY is sent after the commit, coalesced, so neither is part
-- of a create. Rows as in one_by_one.sql. Needs pgbench -M extended or
-- prepared (pipelines).
\set r random(1, 9000000000000000000)
\startpipeline
BEGIN;
SELECT lk.locked,
       set_config('quill.claimed', CASE WHEN lk.locked AND (rec.key IS NULL OR rec.forget_at <= now()) THEN 'on' ELSE 'off' END, true) = 'on',
       rec.key, rec.action, rec.version, rec.fingerprint, rec.field_hashes,
       coalesce(rec.resource, ''), rec.response_status, rec.response_body, coalesce(rec.response_location, ''),
       rec.created_at, rec.completed_at, rec.expires_at, rec.forget_at, rec.compacted_at
FROM (SELECT pg_try_advisory_xact_lock(:r) AS locked) lk
LEFT JOIN (SELECT * FROM bench_raw.operations WHERE tenant = 'bench' AND key = 'pgb-' || :client_id::text || '-' || :r::text) rec ON true;
DELETE FROM bench_raw.operations WHERE tenant = 'bench' AND key = 'pgb-' || :client_id::text || '-' || :r::text
  AND forget_at <= now() AND current_setting('quill.claimed') = 'on';
INSERT INTO bench_raw.notes (id, tenant, title, body, created_at)
SELECT md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'bench', 'bench note pgb-' || :client_id::text || '-' || :r::text,
        rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '), now()
WHERE current_setting('quill.claimed') = 'on';
INSERT INTO bench_raw.outbox_events (id, tenant, operation_key, aggregate_id, type, payload, traceparent, created_at)
SELECT gen_random_uuid(), 'bench', 'pgb-' || :client_id::text || '-' || :r::text, md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'note.created',
        convert_to(rpad('{"specversion":"1.0","id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 612, '","data":{"body":"lorem ipsum'), 'UTF8'),
        NULL, now()
WHERE current_setting('quill.claimed') = 'on';
INSERT INTO bench_raw.operations (tenant, key, action, version, fingerprint, field_hashes, resource,
        response_status, response_body, response_location, created_at, completed_at, expires_at, forget_at)
SELECT 'bench', 'pgb-' || :client_id::text || '-' || :r::text, 'create-note', 1,
        sha256(convert_to(:r::text, 'UTF8')),
        ('{"body": "' || md5(:r::text) || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || '", "title": "' || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || md5(:r::text)
          || '", "attachment": "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"}')::jsonb,
        '/v1/notes/' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 201,
        convert_to(rpad('{"id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 359, '","body":"lorem ipsum'), 'UTF8'),
        '/v1/notes/' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, now(), now(), now() + interval '72 hours', now() + interval '720 hours'
WHERE current_setting('quill.claimed') = 'on';
COMMIT;
\endpipeline
