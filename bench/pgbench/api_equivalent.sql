-- Every statement one API note create sends (issue 18: one statement since
-- 2026-12-01), pipelined in its one round trip the way pgx sends its batch —
-- PostgreSQL's share of a create without Go, HTTP or JSON: BEGIN; the
-- transaction's lock_timeout; one CTE that claims the key (advisory lock +
-- record read) and, only when claimed, inserts the note, its outbox event and
-- the operation record; COMMIT. The token lookup is cached by the API
-- (QUILL_TOKEN_CACHE_TTL) and the relays' NOTIFY is sent after the commit,
-- coalesced, so neither is part of a create. Rows as in one_by_one.sql. Needs
-- pgbench -M extended or prepared (pipelines).
\set r random(1, 9000000000000000000)
\startpipeline
BEGIN;
SELECT set_config('lock_timeout', '3000', true);
WITH lk AS (
    SELECT pg_try_advisory_xact_lock(:r) AS locked
), rec AS (
    SELECT * FROM bench_raw.operations WHERE tenant = 'bench' AND key = 'pgb-' || :client_id::text || '-' || :r::text
), claim AS (
    SELECT lk.locked, lk.locked AND NOT EXISTS (SELECT 1 FROM rec) AS claimed FROM lk
), note AS (
    INSERT INTO bench_raw.notes (id, tenant, title, body, created_at)
    SELECT md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'bench', 'bench note pgb-' || :client_id::text || '-' || :r::text,
        rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '), now()
    FROM claim WHERE claim.claimed
), event AS (
    INSERT INTO bench_raw.outbox_events (id, tenant, operation_key, aggregate_id, type, payload, traceparent, created_at)
    SELECT gen_random_uuid(), 'bench', 'pgb-' || :client_id::text || '-' || :r::text, md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'note.created',
        convert_to(rpad('{"specversion":"1.0","id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 612, '","data":{"body":"lorem ipsum'), 'UTF8'),
        NULL, now()
    FROM claim WHERE claim.claimed
), op AS (
    INSERT INTO bench_raw.operations (tenant, key, action, version, fingerprint, field_hashes, resource,
        outcome, response_body, created_at, completed_at, expires_at, forget_at)
    SELECT 'bench', 'pgb-' || :client_id::text || '-' || :r::text, 'create-note', 1,
        sha256(convert_to(:r::text, 'UTF8')),
        ('{"body": "' || md5(:r::text) || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || '", "title": "' || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || md5(:r::text)
          || '", "attachment": "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"}')::jsonb,
        '/v1/notes/' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 'created',
        convert_to(rpad('{"id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 359, '","body":"lorem ipsum'), 'UTF8'),
        now(), now(), now() + interval '72 hours', now() + interval '720 hours'
    FROM claim WHERE claim.claimed
)
SELECT claim.locked, claim.claimed, rec.key, rec.action, rec.version, rec.fingerprint, rec.field_hashes,
       coalesce(rec.resource, ''), rec.outcome, rec.response_body,
       rec.created_at, rec.completed_at, rec.expires_at, rec.forget_at, rec.compacted_at
FROM claim LEFT JOIN rec ON true;
COMMIT;
\endpipeline
