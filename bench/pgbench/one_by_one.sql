-- One note create as the API's transaction writes it, statement by statement:
-- BEGIN, the note, its outbox event, its operation record, COMMIT — five
-- round trips. Rows are the size the API writes (title ~32 B, body 200 B,
-- CloudEvent payload ~610 B, recorded response ~360 B, field_hashes with three
-- SHA-256 hex digests). The note's id is derived from the key (md5 as uuid)
-- so that every statement can name it without an extra round trip; the
-- event's id comes from gen_random_uuid() (the API's ids are UUIDv7). Keys are
-- pgb-<client_id>-<random 63-bit>, so no two clients collide. Works with every
-- pgbench -M mode.
-- Run by scripts/bench-api.sh as: pgbench -n -f one_by_one.sql -M prepared ...
\set r random(1, 9000000000000000000)
BEGIN;
INSERT INTO bench_raw.notes (id, tenant, title, body, created_at)
VALUES (md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'bench', 'bench note pgb-' || :client_id::text || '-' || :r::text,
        rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '), now());
INSERT INTO bench_raw.outbox_events (id, tenant, operation_key, aggregate_id, type, payload, traceparent, created_at)
VALUES (gen_random_uuid(), 'bench', 'pgb-' || :client_id::text || '-' || :r::text, md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'note.created',
        convert_to(rpad('{"specversion":"1.0","id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 612, '","data":{"body":"lorem ipsum'), 'UTF8'),
        NULL, now());
INSERT INTO bench_raw.operations (tenant, key, action, version, fingerprint, field_hashes, resource,
        outcome, response_body, created_at, completed_at, expires_at, forget_at)
VALUES ('bench', 'pgb-' || :client_id::text || '-' || :r::text, 'create-note', 1,
        sha256(convert_to(:r::text, 'UTF8')),
        ('{"body": "' || md5(:r::text) || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || '", "title": "' || md5(md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text) || md5(:r::text)
          || '", "attachment": "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"}')::jsonb,
        '/v1/notes/' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 'created',
        convert_to(rpad('{"id":"' || md5('pgb-' || :client_id::text || '-' || :r::text)::uuid::text, 359, '","body":"lorem ipsum'), 'UTF8'),
        now(), now(), now() + interval '72 hours', now() + interval '720 hours');
END;
