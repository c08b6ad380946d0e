-- The same create as one_by_one.sql — the note, its outbox event and its
-- operation record, same rows and sizes — as a single statement: one round
-- trip, one implicit transaction. Data-modifying CTEs always run, whether or
-- not the outer query reads them.
-- Run by scripts/bench-api.sh as: pgbench -n -f one_round_trip.sql -M prepared ...
\set r random(1, 9000000000000000000)
WITH note AS (
    INSERT INTO bench_raw.notes (id, tenant, title, body, created_at)
    VALUES (md5('pgb-' || :client_id::text || '-' || :r::text)::uuid, 'bench', 'bench note pgb-' || :client_id::text || '-' || :r::text,
            rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '), now())
    RETURNING id
), event AS (
    INSERT INTO bench_raw.outbox_events (id, tenant, operation_key, aggregate_id, type, payload, traceparent, created_at)
    SELECT gen_random_uuid(), 'bench', 'pgb-' || :client_id::text || '-' || :r::text, note.id, 'note.created',
           convert_to(rpad('{"specversion":"1.0","id":"' || note.id::text, 612, '","data":{"body":"lorem ipsum'), 'UTF8'),
           NULL, now()
    FROM note
)
INSERT INTO bench_raw.operations (tenant, key, action, version, fingerprint, field_hashes, resource,
        outcome, response_body, created_at, completed_at, expires_at, forget_at)
SELECT 'bench', 'pgb-' || :client_id::text || '-' || :r::text, 'create-note', 1,
       sha256(convert_to(:r::text, 'UTF8')),
       ('{"body": "' || md5(:r::text) || md5(note.id::text) || '", "title": "' || md5(note.id::text) || md5(:r::text)
         || '", "attachment": "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"}')::jsonb,
       '/v1/notes/' || note.id::text, 'created',
       convert_to(rpad('{"id":"' || note.id::text, 359, '","body":"lorem ipsum'), 'UTF8'),
       now(), now(), now() + interval '72 hours', now() + interval '720 hours'
FROM note;
