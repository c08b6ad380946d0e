-- Every statement one API note update sends (PATCH /v1/notes/{id} with
-- If-Match, issue 26), in the round trips it sends them in — PostgreSQL's
-- share of an update without Go, HTTP or JSON. Needs pgbench -M extended or
-- prepared (pipelines), and the notes of api_update_seed.sql: client
-- :client_id updates its own note, as each loadgen client does, so no two
-- clients wait for one row lock.
--
-- The API's update is three round trips (internal/notes planUpdate over
-- db.Pipeline; seen on the wire with strace, 2026-12-02):
--   1. BEGIN and the transaction's lock_timeout, one pipelined batch: the
--      lock read that follows is run at once (db.Pipeline.QueryRow), which
--      flushes what is queued before it and waits for it;
--   2. the lock read: the live note joined to its attachment, FOR UPDATE OF
--      n — the API needs its version and fields before it can plan (412 or
--      not, what changed, the event's data, the recorded answer);
--   3. one pipelined batch: the claim statement (idempotency.NewClaimWrite
--      (outbox.EventInsert): advisory lock, record read, the record's insert
--      and the note.updated event's, each guarded), the note's UPDATE
--      guarded by the claim's transaction-local flag, COMMIT.
-- Since then (the same day) db.Pipeline.QueryRow sends the lock read with
-- BEGIN and the lock timeout: the API's update is two round trips (1 and 2
-- together, then 3), which internal/notes' TestEveryWriteIsOneClaimStatement
-- counts. This script still sends 1 and 2 apart, as measured in
-- bench/README.md's "Updates" run: its tx/s is a ceiling one round trip
-- slower than the API's path. Not re-measured since.
--
-- What differs from the API, as pgbench allows:
--   - the values are computed here in SQL (md5, rpad), where the API binds
--     them; they are the sizes the API writes (measured on its rows: title
--     ~34 B, body ~224 B, event payload 688 B, recorded answer 442 B, four
--     field hashes); pgbench binds its variables as text, so the claim's
--     parameters keep their casts as the API's do;
--   - the advisory lock id is the random :r (the API's is a hash of tenant
--     and key), the event id gen_random_uuid() (the API derives it from
--     note, version and key), created_at/completed_at now();
--   - the next version comes back to pgbench in round trip 2 (\gset) and is
--     bound in 3, as the API computes it; the API reads the whole row to
--     render the answer, pgbench keeps only the version;
--   - the relays' NOTIFY (after the commit, coalesced) and the token lookup
--     (cached) are not part of the API's transaction, so not here either.
\set r random(1, 9000000000000000000)
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT set_config('lock_timeout', '3000', true);
\endpipeline
SELECT n.id, n.tenant, n.title, n.body, n.created_at, n.version, coalesce(n.updated_at, n.created_at),
       a.id, a.filename, a.content_type, a.size, a.sha256, a.status, a.result, a.reason, a.processed_at
FROM bench_raw.notes n LEFT JOIN bench_raw.attachments a ON a.note_id = n.id
WHERE n.tenant = 'bench' AND n.id = md5('pgb-note-' || :client_id::text)::uuid AND n.deleted_at IS NULL
FOR UPDATE OF n
\gset n_
\set next :n_version + 1
\startpipeline
WITH lk AS (SELECT pg_try_advisory_xact_lock(:r) AS locked),
rec AS (SELECT * FROM bench_raw.operations WHERE tenant = 'bench'::text AND key = ('pgb-u-' || :client_id::text || '-' || :r::text)),
claim AS MATERIALIZED (SELECT lk.locked,
    lk.locked AND NOT EXISTS (SELECT 1 FROM rec WHERE rec.forget_at > now()) AS claimed FROM lk),
w0 AS (INSERT INTO bench_raw.operations (tenant, key, action, version, fingerprint, field_hashes, resource, outcome,
        response_body, created_at, completed_at, expires_at, forget_at, resource_version)
    SELECT 'bench'::text, ('pgb-u-' || :client_id::text || '-' || :r::text)::text, 'update-note'::text, 1::int,
        sha256(convert_to(:r::text, 'UTF8'))::bytea,
        ('{"id": "' || md5(:client_id::text) || md5(:r::text) || '", "body": "' || md5(:r::text) || md5(:next::text)
          || '", "title": "' || md5(:next::text) || md5(:r::text) || '", "if_match": "' || md5(:n_version::text) || md5(:client_id::text) || '"}')::jsonb,
        nullif('/v1/notes/' || md5('pgb-note-' || :client_id::text)::uuid::text, ''), 'updated'::text,
        convert_to(rpad('{"id":"' || md5('pgb-note-' || :client_id::text)::uuid::text, 442, '","title":"bench edit lorem ipsum'), 'UTF8')::bytea,
        now(), now(), now() + interval '72 hours', now() + interval '720 hours', :next::int
    FROM claim WHERE claim.claimed
    ON CONFLICT (tenant, key) DO UPDATE SET action = EXCLUDED.action, version = EXCLUDED.version,
        fingerprint = EXCLUDED.fingerprint, field_hashes = EXCLUDED.field_hashes, resource = EXCLUDED.resource,
        outcome = EXCLUDED.outcome, response_body = EXCLUDED.response_body, created_at = EXCLUDED.created_at,
        completed_at = EXCLUDED.completed_at, expires_at = EXCLUDED.expires_at, forget_at = EXCLUDED.forget_at,
        resource_version = EXCLUDED.resource_version,
        compacted_at = NULL, replays = 0, cleaned_events = NULL
    WHERE operations.forget_at <= EXCLUDED.created_at
    RETURNING true AS written),
w1 AS (INSERT INTO bench_raw.outbox_events (id, tenant, operation_key, aggregate_id, type, payload, traceparent, created_at, tracestate)
    SELECT gen_random_uuid(), 'bench'::text, nullif('pgb-u-' || :client_id::text || '-' || :r::text, ''),
        md5('pgb-note-' || :client_id::text)::uuid, 'note.updated'::text,
        convert_to(rpad('{"specversion":"1.0","id":"' || gen_random_uuid()::text, 688, '","data":{"title":"bench edit lorem ipsum'), 'UTF8')::bytea,
        nullif('', ''), now(), nullif('', '')
    FROM w0 WHERE w0.written)
SELECT claim.locked,
    set_config('quill.claimed', CASE WHEN EXISTS (SELECT 1 FROM w0) THEN 'on' ELSE 'off' END, true)::boolean,
    rec.key, rec.action, rec.version, rec.fingerprint, rec.field_hashes,
    coalesce(rec.resource, ''), rec.outcome, rec.response_body,
    rec.created_at, rec.completed_at, rec.expires_at, rec.forget_at, rec.compacted_at, rec.resource_version
FROM claim LEFT JOIN rec ON true;
UPDATE bench_raw.notes SET title = 'bench edit pgb-u-' || :client_id::text || '-' || :r::text,
    body = 'pgb-u-' || :client_id::text || '-' || :r::text || ' ' || rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '),
    version = :next, updated_at = now()
WHERE tenant = 'bench' AND id = md5('pgb-note-' || :client_id::text)::uuid AND current_setting('quill.claimed'::text)::boolean;
COMMIT;
\endpipeline
